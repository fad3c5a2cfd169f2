"""Rule cpu-bound: request workers seen running the service's own Python in an attach capture."""

from __future__ import annotations

import subprocess
import sys

import pytest
from attach.sampled import CPU, analysed, ids
from timelines import analysed as analysed_requests, population

from latprof.report.verdict import decide_verdict
from latprof.engine import run_rules
from latprof.layers import APP
from latprof.rules.cpu_bound import CpuBound, Thresholds


def test_workers_running_python_most_of_their_busy_time_give_a_finding_at_the_hot_frame():
    aa = analysed({"cpu": 0.7, "socket": 0.3})
    (finding,) = run_rules(aa, [CpuBound()])
    assert (finding.rule, finding.layer, finding.severity) == ("cpu-bound", APP, "critical")
    evidence = finding.evidence
    assert evidence["share_of_busy_time"] == 0.7 and evidence["share_of_busy_and_queue_time"] == 0.7
    assert evidence["workers"] == 2 and evidence["idle_share"] == 0.0 and evidence["samples"] == 420
    assert evidence["hot_frames"] == {f"{CPU.function} ({CPU.filename})": 420}
    assert evidence["signatures"] == {"running": 420} and evidence["source"] == "stack samples"
    assert finding.summary == ("70% of busy worker time plus queue time was spent running the service's own Python code on"
                               f" the CPU; mostly at {CPU.function} ({CPU.filename}).")  # fmt: skip
    # 2 workers x 0.7 of 3 s at 100 Hz: 4.2 thread-seconds, per second of the capture (the last sample's second counts), in ms
    assert finding.impact_ms == round(4.2 / aa.seconds * 1000, 1) and 3 < aa.seconds <= 4
    assert finding.confidence == 1.0
    assert finding.fix == " ".join(CpuBound.docs()["How to fix"].split())
    # the verdict is the app layer, and names this rule
    verdict = decide_verdict(aa, [finding])
    assert (verdict.layer, verdict.rule, verdict.summary) == (APP, "cpu-bound", finding.summary)


def test_attach_min_share_is_the_boundary():
    aa = analysed({"cpu": 0.3, "socket": 0.7})
    assert ids(run_rules(aa, [CpuBound(Thresholds(attach_min_share=0.3))])) == ["cpu-bound"]
    assert ids(run_rules(aa, [CpuBound(Thresholds(attach_min_share=0.31))])) == []
    assert ids(run_rules(aa, [CpuBound()])) == ["cpu-bound"]  # the default, 0.2
    (finding,) = run_rules(aa, [CpuBound()])
    assert finding.severity == "warning"  # under half of busy time


def test_workers_mostly_waiting_give_nothing():
    assert run_rules(analysed({"cpu": 0.1, "socket": 0.9}), [CpuBound()]) == []


def test_it_judges_samples_only_and_finds_nothing_in_requests():
    assert CpuBound.judges() == ("samples",)
    analysis = analysed_requests(population(200, [(APP, 100.0)], [(APP, 900.0)]))
    assert analysis.has_tail
    assert run_rules(analysis, [CpuBound()]) == []  # not asked: no crash finding either


def test_rules_explain_cpu_bound():
    out = subprocess.run([sys.executable, "-m", "latprof", "rules", "explain", "cpu-bound"],
                         capture_output=True, text=True, timeout=60)  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert "running the service's own Python code" in out.stdout and "attach_min_share" in out.stdout


@pytest.mark.parametrize("share", [0.2, 0.5])
def test_thresholds_are_typed_and_frozen(share):
    t = Thresholds(attach_min_share=share)
    with pytest.raises(Exception):
        t.__setattr__("attach_min_share", 0.9)
