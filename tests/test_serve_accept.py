"""The acceptance check "LLM serving at SLO": a spec naming the endpoint, model, SLOs and expected goodput."""

from __future__ import annotations

import pytest

from dlscale import accept
from dlscale.errors import UsageError
from dlscale.serve.instant import InstantServer


def _spec(tmp_path, url: str, expected: float, extra: str = "") -> str:
    p = tmp_path / "serving.yaml"
    p.write_text(f"""name: serving-box
checks:
  serving: {{url: "{url}", model: m, concurrencies: [2], requests: 20, warmup: 0, calibrate: false,
            output_len: "4", prompt_len: "4", slo: "ttft=30,tpot=30", expected_goodput: {expected}{extra}}}
""")
    return str(p)


@pytest.mark.long
def test_serving_check_judges_goodput_against_the_spec(tmp_path, db_path):
    with InstantServer(model="m") as srv:
        ok = accept.run_suite(_spec(tmp_path, srv.url, 0.001), out_dir=str(tmp_path / "a"))
        bad = accept.run_suite(_spec(tmp_path, srv.url, 1e9), out_dir=str(tmp_path / "b"))
    (v,) = [v for v in ok.verdicts if v.check == "serving"]
    assert (v.figure, v.status, v.expectation, v.unit) == ("goodput at SLO", "PASS", "spec", "requests/s")
    assert "expected_goodput 0.001" in v.source and ok.exit_code == 0
    (v,) = [v for v in bad.verdicts if v.check == "serving"]
    assert v.status == "FAIL" and bad.exit_code == 1  # a shortfall of ~100%, significant over the five slices


def test_serving_check_needs_an_endpoint_and_good_values(tmp_path):
    from dlscale.accept.plan import spec as specs

    assert "serving" not in specs.FULL and "serving" not in specs.QUICK
    p = tmp_path / "s.yaml"
    for body, words in (("serving: {model: m}", "needs url"),
                        ('serving: {url: "http://h:1", model: m, expected_goodput: -1}', "expected_goodput"),
                        ('serving: {url: "http://h:1", model: m, bogus: 1}', "unknown option 'bogus'"),
                        ('serving: {url: "http://h:1", model: m, slo: "ttft=x"}', "--slo")):
        p.write_text(f"checks:\n  {body}\n")
        sp = specs.load(str(p))
        with pytest.raises(UsageError, match=words):
            specs.validate(sp, "serving", sp.checks["serving"])
