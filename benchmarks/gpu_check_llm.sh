# The second call of the GPU check, `bash benchmarks/gpu_check.sh --llm` (sourced by gpu_check.sh after
# its env step: step(), $DL, $PEER, $PY, $DEVICE, $DEST and the deadline are gpu_check.sh's). The LLM
# figures at the sizes they are about, most telling first, each step timed:
#
#   infer llama_7b b1 decode compiled / eager        each against its memory limit (bytes/s, fraction of the
#                                                    copy measured first and of the datasheet)
#   transformers serve --continuous-batching         measured by serve-bench: goodput at the MLPerf Llama 3.1
#     on llama_7b (inference.py serve)             8B SLO, J per output token (needs benchmarks/gpu_wheels.txt)
#   train llama3.2_1b bf16 --compile, fused AdamW    vs  the same plain loop (gpu_peers.py train-llm); MFU
#   infer llama_7b b1 decode graph-eager             vs  transformers generate eager (DynamicCache, compile
#                                                        off) and compiled (static cache, torch.compile + CUDA graphs)
#
# then the table (gpu_check_table.py reads whatever the steps left) and exit: this call runs none of the
# first call's steps. The CPU dry run (--device cpu --llm) runs the same steps at llama_tiny's size.
# Deadline: the first call's (480 s) unless --deadline says more; a machine's 10-minute call holds --deadline 570.
if [ "$DEVICE" = cuda ]; then
  BIG=llama_7b; BIGP=bf16; BP=128; BO=64
  TRAIN_MODEL=llama3.2_1b; TRAIN=(--precision bf16 --batch-size 4 --seq-len 2048); PTRAIN=(--precision bf16 --batch 4 --seq 2048)
  TSTEPS=(--warmup-steps 10 --steps 20); PTSTEPS=(--warmup 10 --steps 20)
  SERVE=(--model llama_7b --precision bf16 --device cuda)
else
  BIG=llama_tiny; BIGP=fp32; BP=16; BO=16
  TRAIN_MODEL=llama_tiny; TRAIN=(--precision bf16 --batch-size 2 --seq-len 64); PTRAIN=(--precision bf16 --batch 2 --seq 64)
  TSTEPS=(--warmup-steps 2 --steps 3); PTSTEPS=(--warmup 2 --steps 3)
  SERVE=(--model llama_tiny --precision fp32 --device cpu --concurrencies 1,2 --requests 6 --prompt-len 16 --output-len 8 --slo ttft=60,tpot=10)
fi
BIG_CONFIG=$($PY -c "import json; from dlscale.domains.llm.workload import SIZES; print(json.dumps(SIZES['$BIG']))")
TRAIN_CONFIG=$($PY -c "import json; from dlscale.domains.llm.workload import SIZES; print(json.dumps(SIZES['$TRAIN_MODEL']))")
BIGD=(--precision $BIGP --batch-sizes 1 --prompt-len $BP --output-len $BO --warmup 1 --iters 5 --device "$DEVICE" --tag gpu-check --format json)
BIGG=(--config "$BIG_CONFIG" --precision $BIGP --batch 1 --prompt $BP --output $BO --warmup 1 --reps 3)

step llm_decode_compiled 150 $DL infer $BIG --decode compiled "${BIGD[@]}"
step llm_decode_eager 90 $DL infer $BIG --decode eager "${BIGD[@]}"
step llm_serve 240 $PY benchmarks/inference.py serve "${SERVE[@]}"
step llm_train 150 $DL train $TRAIN_MODEL "${TRAIN[@]}" --compile --optimizer-impl fused "${TSTEPS[@]}" --device "$DEVICE" --tag gpu-check --format json
step llm_peer_train 150 $PEER train-llm --config "$TRAIN_CONFIG" "${PTRAIN[@]}" --compile --fused "${PTSTEPS[@]}"
[ "$DEVICE" = cuda ] && step llm_decode_graph_eager 90 $DL infer $BIG --decode graph-eager "${BIGD[@]}"
step llm_peer_generate_eager 90 $PEER generate "${BIGG[@]}" --mode eager
step llm_peer_generate_compiled 150 $PEER generate "${BIGG[@]}" --mode compiled
$PY benchmarks/gpu_check_table.py "$DEST" | tee "$DEST/table.md"
echo "gpu_check --llm: records in $DEST/results.db, logs in $DEST/log.txt ($(( $(date +%s) - T0 )) s)" >&2
verdict  # gpu_check.sh's: exit 1 when a step that ran failed
