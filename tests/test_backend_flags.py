"""harness.device's TF32 and cuDNN flags: what --precision sets, recorded in the run's config and restored
after an API call (train, infer, micro). torch.backends' flags can be set and read on a CPU build too."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from dlscale.harness import device as dev  # noqa: E402

ODD = {"matmul": "medium", "cudnn_tf32": True, "benchmark": False}  # what a notebook might have set before


@pytest.fixture
def odd_flags():
    """Flags set as no run sets them; the test's own flags restored after it."""
    saved = (torch.get_float32_matmul_precision(), torch.backends.cudnn.allow_tf32, torch.backends.cudnn.benchmark)
    torch.set_float32_matmul_precision(ODD["matmul"])
    torch.backends.cudnn.allow_tf32, torch.backends.cudnn.benchmark = ODD["cudnn_tf32"], ODD["benchmark"]
    yield
    torch.set_float32_matmul_precision(saved[0])
    torch.backends.cudnn.allow_tf32, torch.backends.cudnn.benchmark = saved[1], saved[2]


def still_odd() -> bool:
    return (torch.get_float32_matmul_precision(), torch.backends.cudnn.allow_tf32,
            torch.backends.cudnn.benchmark) == (ODD["matmul"], ODD["cudnn_tf32"], ODD["benchmark"])


FP32 = {"matmul_tf32": False, "cudnn_tf32": False, "cudnn_benchmark": True}


@pytest.mark.parametrize("precision, benchmark, want", [
    ("fp32", True, FP32),
    ("tf32", True, {"matmul_tf32": True, "cudnn_tf32": True, "cudnn_benchmark": True}),
    ("bf16", False, {"matmul_tf32": False, "cudnn_tf32": False, "cudnn_benchmark": False}),
    ("int8", True, FP32),
])
def test_each_precision_sets_its_flags_for_the_run_and_they_are_restored(odd_flags, precision, benchmark, want):
    with dev.run_flags(precision, torch.device("cpu"), benchmark) as flags:
        assert flags == want == dev.backend_flags()
        assert torch.get_float32_matmul_precision() == ("high" if precision == "tf32" else "highest")
    assert still_odd()


def test_flags_are_restored_when_the_run_fails(odd_flags):
    with pytest.raises(RuntimeError, match="planted"):
        with dev.run_flags("tf32"):
            raise RuntimeError("planted")
    assert still_odd()


def test_infer_records_its_flags_and_restores_them(db_path, odd_flags):
    from dlscale import api

    from dlscale.infer.config import InferConfig

    assert InferConfig("tinycnn").cudnn_benchmark is True  # the default: a run's shapes are fixed
    rec = api.infer(model="tinycnn", batch_sizes="2", iters=2, warmup=1, cudnn_benchmark=False, db=str(db_path))
    assert rec.config["backend_flags"] == {**FP32, "cudnn_benchmark": False} and still_odd()


def test_train_records_its_flags_and_restores_them(db_path, odd_flags):
    from dlscale import api

    rec = api.train(model="tinycnn", image_size=32, batch_size=4, steps=2, warmup_steps=1, breakdown_steps=0,
                    monitor_interval=0, cudnn_benchmark=False, db=str(db_path))
    assert rec.config["backend_flags"] == {**FP32, "cudnn_benchmark": False} and still_odd()


def test_micro_records_each_precisions_flags_and_restores_them(db_path, odd_flags):
    from dlscale import api

    (rec,) = api.micro("gemm", precisions=("fp32", "bf16"), max_gflop=0.002, reps=3, warmup=1, db=str(db_path))
    assert rec.config["backend_flags"] == {"fp32": FP32, "bf16": FP32} and still_odd()


def test_infer_refuses_tf32_on_a_cpu_in_one_line(cli):
    res = cli("infer", "tinycnn", "--precision", "tf32", "--device", "cpu", "--batch-sizes", "1")
    assert res.code == 2 and "tf32" in res.stderr and len(res.stderr.strip().splitlines()) == 1


def test_llm_infer_keeps_no_cudnn_benchmark_and_restores_the_flags(db_path, odd_flags):
    """LLM prefill/decode runs under run_flags too: --no-cudnn-benchmark holds through it, and a direct
    call of the engine restores what was set before."""
    from dlscale import api
    from dlscale.infer.llm import run_llm_inference

    rec = api.infer(model="llama_tiny", batch_sizes="1", prompt_len=4, output_len=2, iters=1, warmup=1,
                    cudnn_benchmark=False, db=str(db_path))
    assert rec.config["backend_flags"] == {**FP32, "cudnn_benchmark": False} and still_odd()
    run_llm_inference("llama_tiny", batch_sizes=[1], prompt_len=4, output_len=2, precision="fp32", device="cpu",
                      warmup=1, iters=1)
    assert still_odd()


def test_tta_restores_the_flags(monkeypatch, odd_flags):
    """A time-to-quality run sets its precision's flags for the run and restores them after it."""
    from test_tta_domain import FakeTask, _run

    from dlscale.tta import tasks
    from dlscale.tta.config import TTAConfig

    seen = []
    task = FakeTask()
    monkeypatch.setitem(tasks._TASKS, "recommendation", task)
    monkeypatch.setattr(task, "open", lambda *a, fake_open=task.open: seen.append(dev.backend_flags()) or fake_open(*a))
    _run(TTAConfig(model="ncf", data="d", target=0.9, threads=1))
    assert seen == [FP32] and still_odd()
