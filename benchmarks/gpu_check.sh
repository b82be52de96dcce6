#!/usr/bin/env bash
# dlscale's GPU check: on one GPU, from source, with the machine's own torch, in 8 minutes (--quick: 4).
# Each figure dlscale reports is set beside a plain PyTorch program doing the same work in the same
# run (benchmarks/gpu_peers.py), alternated A/B/A/B where it is cheap, and the GPU tests run:
#
#   short test ResNet-50 bf16 channels_last b256   vs  a plain training loop
#   micro gemm, best bf16                           vs  torch.matmul 8192^3
#   micro memory, device copy                       vs  copy_ of 1 GiB
#   infer LoadGen offline ResNet-50 bf16 b64        vs  the same run's raw batch rate: device-timed, and as LoadGen times it
#   infer LoadGen offline ResNet-18 bf16 b64        vs  the same (about 1 ms a batch: the harness's cost per batch)
#   infer llama_small b1 decode eager / compiled    vs  transformers generate eager (DynamicCache, compile off)
#     / graph-eager, each against its memory limit      / compiled (static cache, torch.compile + CUDA graphs)
#   accept --quick, twice                           (the second judged against the first)
#   pytest -m gpu                                   (the GPU tests)
#
# then prints one table of ratios (benchmarks/gpu_check_table.py) and leaves the records, logs and
# JSON in the output folder. Usage:
#
#   bash benchmarks/gpu_check.sh                  # on a GPU machine; writes to $OUT or ./gpu-check-DATE
#   bash benchmarks/gpu_check.sh --quick          # 4 minutes: the acceptance and the cheap pairs (QUICK_DROP)
#   bash benchmarks/gpu_check.sh --device cpu     # the dry run: the same steps at toy sizes on a CPU
#   bash benchmarks/gpu_check.sh --out DIR --deadline 480 --python /path/to/python
#   bash benchmarks/gpu_check.sh --llm            # the second call (benchmarks/gpu_check_llm.sh): llama_7b decode
#                                                 # against its limit and its peers, llama training compiled with a
#                                                 # fused AdamW beside a plain loop (MFU), transformers serve under
#                                                 # serve-bench (carry benchmarks/gpu_wheels.txt); on a machine's
#                                                 # 10-minute call give it --deadline 570
#
# The budget: --deadline seconds in all (480; --quick 240; a CPU's dry run three times that). The steps in
# MUST (the acceptance, the GPU tests) always run: the time they are expected to take (NEED, as seen on an
# H200) is held back from the steps before them, and any other step runs only while what is left covers
# its own NEED and every MUST step still to come; else it is skipped for time (never started to be
# killed). Each step runs under min(its limit, the time left). --quick drops the steps in QUICK_DROP.
# The table names every step dropped or skipped. Exit 1 if a step that ran failed or a MUST step did not
# run.
set -u
cd "$(dirname "$0")/.."
DEVICE=cuda; DEADLINE=; QUICK=0; PY=${PYTHON:-python3}; DEST=${OUT:-gpu-check-$(date +%Y%m%d-%H%M%S)}
while [ $# -gt 0 ]; do
  case "$1" in
    --device) DEVICE=$2; shift 2 ;;
    --quick) QUICK=1; shift ;;
    --deadline) DEADLINE=$2; shift 2 ;;
    --out) DEST=$2; shift 2 ;;
    --python) PY=$2; shift 2 ;;
    --llm) LLM_CALL=1; shift ;;
    -h|--help) sed -n '2,29p' "$0"; exit 0 ;;
    *) echo "gpu_check: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
done
case "$DEVICE" in cuda|cpu) ;; *) echo "gpu_check: --device is cuda or cpu, not $DEVICE" >&2; exit 2 ;; esac
# a CPU (the dry run) gets three times each step's limit: a 2-core machine's accept --quick alone takes minutes
SCALE=1; [ "$DEVICE" = cpu ] && SCALE=3
DEADLINE=${DEADLINE:-$(( (QUICK ? 240 : 480) * SCALE ))}
# seconds each step is expected to take (an H200's, benchmarks' README of real GPU runs, 2026-11-28; the
# acceptance with its longer windows; loadgen_short, decode_graph_eager and peer_generate_eager: estimates
# from their neighbours); a step not listed: a third of its limit
declare -A NEED=([env]=5 [train_a]=33 [peer_train_a]=19 [train_b]=33 [peer_train_b]=19 [gemm]=12 [peer_matmul]=10
  [memory]=19 [peer_copy]=10 [loadgen]=14 [loadgen_short]=12 [decode_eager]=34 [decode_compiled]=46
  [decode_graph_eager]=20 [peer_generate_eager]=34 [peer_generate_compiled]=42 [accept_1]=180 [accept_2]=180
  [pytest_gpu]=110)
MUST=" accept_1 pytest_gpu "  # what the check is for: never skipped for time
QUICK_DROP=" train_a peer_train_a train_b peer_train_b loadgen loadgen_short decode_eager decode_compiled
  decode_graph_eager peer_generate_eager peer_generate_compiled accept_2 pytest_gpu "
[ "$DEVICE" = cpu ] && MUST=" accept_1 "  # no GPU tests on a CPU
[ -n "${LLM_CALL:-}" ] && MUST=" "  # the second call (--llm) runs none of them
QUICK_DROP=" $(echo $QUICK_DROP) "  # one line, each name between spaces
if [ "$QUICK" = 1 ]; then for m in $MUST; do [[ "$QUICK_DROP" == *" $m "* ]] && MUST=${MUST/ $m / }; done; fi
mkdir -p "$DEST" || exit 2
DEST=$(cd "$DEST" && pwd)
# from source, with whatever torch this python has: the repository's src first on the path
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 DLSCALE_DB="$DEST/results.db"
exec > >(tee -a "$DEST/log.txt") 2>&1
DL="$PY -m dlscale.cli.app"; PEER="$PY benchmarks/gpu_peers.py --device $DEVICE"
T0=$(date +%s); : > "$DEST/steps.tsv"

need() { local n=${NEED[$1]:-$(( $2 / 3 ))}; echo $(( n * SCALE )); }
held() {  # seconds held back for the MUST steps not yet run (not counting $1)
  local m t=0; for m in $MUST; do [ "$m" != "$1" ] && ! grep -q "^$m"$'\t' "$DEST/steps.tsv" && t=$(( t + $(need "$m" 0) )); done; echo $t
}
ran() { printf '%s\t%s\t%s\n' "$1" "$2" "$3" >> "$DEST/steps.tsv"; }
step() {  # step NAME LIMIT CMD...: CMD's stdout into NAME.json, its end in steps.tsv
  local name=$1 lim=$(( $2 * SCALE )) limit=$2; shift 2
  if [ "$QUICK" = 1 ] && [[ "$QUICK_DROP" == *" $name "* ]]; then echo "=== $name dropped (--quick)"; ran "$name" "dropped (--quick)" 0; return; fi
  local now=$(( $(date +%s) - T0 )); local left=$(( DEADLINE - now ))
  if [[ "$MUST" != *" $name "* ]]; then  # the MUST steps still to come keep their time
    left=$(( left - $(held "$name") ))
    if [ "$left" -lt "$(need "$name" "$limit")" ]; then echo "=== $name skipped (time, t=${now}s)"; ran "$name" "skipped (time)" 0; return; fi
  fi
  if [ "$left" -lt 10 ]; then echo "=== $name skipped (deadline, t=${now}s)"; ran "$name" "skipped (deadline)" 0; return; fi
  [ "$lim" -gt "$left" ] && lim=$left
  echo "=== $name (limit ${lim}s, t=${now}s)"
  local s=$(date +%s)
  timeout -k 10 "$lim" "$@" > "$DEST/$name.json"; local rc=$?
  local took=$(( $(date +%s) - s ))
  local how=ok; [ $rc -ne 0 ] && how="rc=$rc"; [ $rc -eq 124 ] && how="timed out"
  echo "=== $name $how in ${took}s"
  ran "$name" "$how" "$took"
}

verdict() {  # exit 1 when a step that ran failed or a MUST step did not end ok (dropped, skipped for time: not)
  local bad=0 name how m
  while IFS=$'\t' read -r name how _; do
    case "$how" in ok|"dropped (--quick)"|"skipped (time)") ;; *) bad=1 ;; esac
    [[ "$MUST" == *" $name "* ]] && [ "$how" != ok ] && bad=1
  done < "$DEST/steps.tsv"
  for m in $MUST; do grep -q "^$m"$'\t' "$DEST/steps.tsv" || bad=1; done
  exit $bad
}

if [ "$DEVICE" = cuda ]; then  # the sizes the GPU check is about
  RN=(resnet50 --image-size 224 --batch-size 256 --precision bf16 --channels-last); PRN=(--model resnet50 --batch 256 --image-size 224 --precision bf16 --channels-last)
  STEPS=(--warmup-steps 10 --steps 60); PSTEPS=(--warmup 10 --steps 60)
  GEMM=(-p bf16); MATMUL=(--n 8192 --precision bf16); COPY=(--bytes 1073741824); MEM=()
  INF=(resnet50 --precision bf16 --batch-sizes 64); LLM=llama_small; LLMP=bf16; PROMPT=128; OUTPUT=64
  INF_SHORT=(resnet18 --precision bf16 --batch-sizes 64)
else  # the dry run: every step at a size a CPU finishes in seconds
  RN=(resnet18 --image-size 32 --batch-size 8 --precision fp32); PRN=(--model resnet18 --batch 8 --image-size 32 --precision fp32)
  STEPS=(--warmup-steps 2 --steps 5); PSTEPS=(--warmup 2 --steps 5)
  GEMM=(-p fp32 --max-gflop 0.05); MATMUL=(--n 512 --precision fp32); COPY=(--bytes 67108864); MEM=(--mem-mib 64)
  INF=(tinycnn --image-size 32 --precision fp32 --batch-sizes 64); LLM=llama_tiny; LLMP=fp32; PROMPT=16; OUTPUT=16
  INF_SHORT=(tinycnn --image-size 32 --precision fp32 --batch-sizes 8)
fi
LLM_CONFIG=$($PY -c "import json; from dlscale.domains.llm.workload import SIZES; print(json.dumps(SIZES['$LLM']))")

step env 60 bash -c "nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,power.limit,driver_version --format=csv >&2 || true; $DL sysinfo --format json"
[ -n "${LLM_CALL:-}" ] && . benchmarks/gpu_check_llm.sh  # the second call: its own steps and table, then exit
step train_a 150 $DL train "${RN[@]}" "${STEPS[@]}" --device "$DEVICE" --tag gpu-check --format json
step peer_train_a 90 $PEER train "${PRN[@]}" "${PSTEPS[@]}"
step train_b 150 $DL train "${RN[@]}" "${STEPS[@]}" --device "$DEVICE" --tag gpu-check --format json
step peer_train_b 90 $PEER train "${PRN[@]}" "${PSTEPS[@]}"
step gemm 90 $DL micro gemm "${GEMM[@]}" --device "$DEVICE" --tag gpu-check --format json
step peer_matmul 45 $PEER matmul "${MATMUL[@]}"
step memory 60 $DL micro memory "${MEM[@]}" --device "$DEVICE" --tag gpu-check --format json
step peer_copy 30 $PEER copy "${COPY[@]}"
step loadgen 90 $DL infer "${INF[@]}" --scenario offline --device "$DEVICE" --tag gpu-check --format json
step loadgen_short 60 $DL infer "${INF_SHORT[@]}" --scenario offline --device "$DEVICE" --tag gpu-check --format json
step decode_eager 60 $DL infer $LLM --precision $LLMP --batch-sizes 1 --prompt-len $PROMPT --output-len $OUTPUT --device "$DEVICE" --tag gpu-check --format json
step decode_compiled 120 $DL infer $LLM --precision $LLMP --batch-sizes 1 --prompt-len $PROMPT --output-len $OUTPUT --decode compiled --device "$DEVICE" --tag gpu-check --format json
[ "$DEVICE" = cuda ] && step decode_graph_eager 90 $DL infer $LLM --precision $LLMP --batch-sizes 1 --prompt-len $PROMPT --output-len $OUTPUT --decode graph-eager --device "$DEVICE" --tag gpu-check --format json
step peer_generate_eager 60 $PEER generate --config "$LLM_CONFIG" --precision $LLMP --batch 1 --prompt $PROMPT --output $OUTPUT --mode eager
step peer_generate_compiled 90 $PEER generate --config "$LLM_CONFIG" --precision $LLMP --batch 1 --prompt $PROMPT --output $OUTPUT --mode compiled
step accept_1 240 $DL accept --quick --out "$DEST/accept_1" --format json
step accept_2 240 $DL accept --quick --out "$DEST/accept_2" --format json
if [ "$DEVICE" = cuda ]; then
  step pytest_gpu 150 bash -c "$PY -m pytest -q -p no:cacheprovider -o addopts='' -m gpu -rs tests >&2; echo '{\"pytest_rc\": '\$?'}'"
fi
$PY benchmarks/gpu_check_table.py "$DEST" | tee "$DEST/table.md"
echo "gpu_check: records in $DEST/results.db, logs in $DEST/log.txt ($(( $(date +%s) - T0 )) s)" >&2
verdict
