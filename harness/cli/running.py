"""The commands that run scenarios or publish results, each through harness/session.py: run, report, calibrate,
golden record."""

from __future__ import annotations

import argparse
import datetime as dt
import json
import shutil
from pathlib import Path
from typing import TYPE_CHECKING

from parity.harness.config import paths
from parity.harness.config.errors import ScenarioError
from parity.harness.config.selection import over_nodes, scenario_files, select
from parity.harness.options import RunOptions, run_options, writable_out_dir
from parity.harness.session import EXIT_FAILED, EXIT_OK, Session, exit_code, merge, selection

if TYPE_CHECKING:
    from parity.harness.contract.schema import Scenario
    from parity.harness.judge.verdict import Verdict
    from parity.harness.runner import Runner


def cmd_run(args: argparse.Namespace) -> int:
    scenarios = over_nodes(selection(args.files, args.k, args.device, args.shard), args.nodes)
    options = run_options(lambda name: getattr(args, name))
    return Session(options, scenarios, progress=True).run_and_publish()


def cmd_report(args: argparse.Namespace) -> int:
    from parity.reports.publish import publish

    out = Path(args.out)
    writable_out_dir(out)
    merged = merge([Path(d) for d in args.dirs], out)
    history = tuple(Path(d) for d in args.history)
    for earlier in history:
        if not (earlier / paths.RESULTS).is_file():
            raise ScenarioError(f"--history {earlier}: no {paths.RESULTS} there (an earlier run's --out directory)")
    publish(out, merged, page=args.html, history=history)
    return exit_code(merged)


def cmd_calibrate(args: argparse.Namespace) -> int:
    from parity.harness.judge.calibrate import band_proposals, distribution, proposals, seeded, step_envelopes

    scenarios = seeded(select(scenario_files(args.files), args.k, None), args.seeds)
    if not scenarios:
        raise ScenarioError("no clean scenario to calibrate on")
    out = Path(args.out)
    session = Session(RunOptions(out_dir=out, cache_dir=Path(args.cache_dir)), scenarios, stream_results=False,
                      figures=False, on_result=lambda v: print(f"{v.status:<5} {v.id}", flush=True))
    if stopped := session.run_all():
        return 128 + stopped.signum
    judged = [r["metrics"] for r in session.results if r["verdict"] in ("PASS", "FAIL")]
    dist = distribution(judged)
    envelopes = step_envelopes([r for r in session.results if r["verdict"] in ("PASS", "FAIL")])
    report = {"runs": len(session.results),
              "false_fails": [r["id"] for r in session.results if r["verdict"] == "FAIL"],
              "errors": [r["id"] for r in session.results if r["verdict"] == "ERROR"], "margin": args.margin,
              "distribution": dist, "proposed_limits": proposals(dist, args.margin),
              "step_envelopes": envelopes, "band_margin": args.band_margin,
              "proposed_bands": band_proposals(envelopes, args.band_margin)}
    out.mkdir(parents=True, exist_ok=True)
    (out / "calibration.json").write_text(json.dumps(report, indent=1))
    for name, stats in dist.items():
        print(f"{name:<18} worst {stats['worst']:.3g}  p90 {stats['p90']:.3g}  median {stats['median']:.3g}  "
              f"-> proposed limit {report['proposed_limits'][name]:.3g}")
    for dtype, bands in report["proposed_bands"].items():  # the per-step growth a long run's limits take
        print(f"band [{dtype}] " + "  ".join(f"{name} {slope:.3g}" for name, slope in bands.items()))
    print(f"{len(report['false_fails'])} FAIL on clean runs (must be 0); written {out / 'calibration.json'}")
    return EXIT_FAILED if report["false_fails"] or report["errors"] else EXIT_OK


def cmd_golden_record(args: argparse.Namespace) -> int:
    """Run each scenario's candidate on the reference device and keep its record as a golden (a failed run is
    not kept), then write the set's manifest."""
    from parity.harness.judge import golden
    from parity.harness.runner import harness_commit

    scenarios = selection(args.files, args.k, args.device)
    out = Path(args.out)
    writable_out_dir(out)
    session = Session(RunOptions(out_dir=out, cache_dir=Path(args.cache_dir)), scenarios, step=_keep_golden,
                      stream_results=False, figures=False, on_result=_golden_line)
    if stopped := session.run_all():
        return 128 + stopped.signum
    recorded = {r["id"]: Path(r["golden_dir"]).name for r in session.results if r["verdict"] == "PASS"}
    path = golden.write_manifest(out, recorded, {"harness_commit": harness_commit(), "device": args.device,
                                                 "created": dt.datetime.now(dt.timezone.utc).isoformat(
                                                     timespec="seconds")})
    print(f"{len(recorded)} goldens, manifest: {path}")
    failed = any(r["verdict"] == "ERROR" for r in session.results)
    return EXIT_FAILED if failed or not recorded else EXIT_OK


def _keep_golden(runner: Runner, scenario: Scenario) -> Verdict:
    """A golden is the candidate's record alone, unjudged: PASS (kept under OUT/<slug>), SKIP or ERROR."""
    from parity.harness.config.validate import skip_reason
    from parity.harness.judge.verdict import Verdict, errored, skipped

    if reason := skip_reason(scenario):
        return skipped(scenario, reason)
    if reason := _beyond_the_card(scenario):
        return skipped(scenario, reason)
    directory = runner.options.out_dir / paths.slug(scenario.id)
    record = runner.execute(scenario, scenario.id, directory)
    if not record.ok:
        shutil.rmtree(directory, ignore_errors=True)  # a golden set never holds a failed run
        return errored(scenario, record)
    return Verdict(scenario.id, "PASS", info={"golden_dir": str(directory)})


def _beyond_the_card(scenario: Scenario) -> str | None:
    """A row the memory plan puts over the recording runner's cards (PARITY_DEVICE_MODEL names them) is not
    attempted: an out-of-memory crash would hold the runner for nothing; the reason says which card it needs."""
    from parity.harness.config.memory import plan_for

    plan = plan_for(scenario)
    if plan is None or plan.level not in ("over", "impossible"):
        return None
    return f"not attempted: the memory plan does not fit it on this runner's cards ({plan.render()})"


def _golden_line(verdict: Verdict) -> None:
    if verdict.status == "PASS":
        print(f"OK    {verdict.id} -> {verdict.info['golden_dir']}", flush=True)
    elif verdict.status == "SKIP":
        print(f"SKIP  {verdict.id}: {verdict.reasons[0]}", flush=True)
    else:
        print(f"ERROR {verdict.id}: {verdict.reasons[0]}", flush=True)
