"""Inference: forward passes of a registered workload, timed by batch size, runtime and precision.

``config.InferConfig`` is the typed, validated configuration of ``dlscale infer``;
``session.open_session`` turns it into a model ready to run (torch eager or compiled, bf16/fp16
autocast, int8 through PT2E post-training quantisation in ``quant``, or onnxruntime);
``run.run_inference`` is the batch-size sweep that the record of kind ``inference`` holds, with
the largest batch that fits, MLPerf LoadGen scenarios (``loadgen``) and LLM prefill/decode
(``llm``) added when asked for. Nothing here imports torch at module level.
"""
