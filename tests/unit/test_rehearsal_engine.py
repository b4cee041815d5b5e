"""The rehearsal's workflow engine (ci/rehearsal/): GitHub's expression rules, matrix expansion, job and step
conditions, the files between steps and the shell GitHub uses, each against what GitHub documents, on small
workflows written here. The real nightly's rehearsal: tests/multiproc/test_rehearsal.py."""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "ci"))

from rehearsal.expressions import ExpressionError, condition, evaluate, substitute  # noqa: E402
from rehearsal.runner import Stage, run_workflow  # noqa: E402
from rehearsal.workflow import dispatch_defaults, load, matrix_rows, order  # noqa: E402

STATUS = {"success": lambda: True, "failure": lambda: False, "always": lambda: True, "cancelled": lambda: False}
CONTEXT = {"inputs": {"device": "", "k": "x"}, "vars": {"ON": "true"}, "matrix": {"stack": "core012"},
           "needs": {"prepare": {"result": "success", "outputs": {"current_910b": "img-a", "core012_910b": "img-b"}}},
           "github": {"event_name": "schedule"}}


@pytest.mark.parametrize(("text", "expected"), [
    ("vars.ON == 'TRUE'", True),  # strings compare without case
    ("inputs.device != 'cpu'", True),
    ("inputs.missing", None),  # a missing property is null
    ("matrix.stack == 'current' && needs.prepare.outputs.current_910b || needs.prepare.outputs.core012_910b", "img-b"),
    ("inputs.k || 'default'", "x"),
    ("inputs.device || 'default'", "default"),
    ("!cancelled() && needs.prepare.result == 'success'", True),
    ("format('{0}-{1}', 'a', matrix.stack)", "a-core012"),
    ("contains('a b c', 'B')", True),
    ("1 == '1'", True),  # unlike types compare as numbers
    ("null == false", True),  # both coerce to 0, as the docs' coercion table says
    ("'' == 'x'", False),
])
def test_expressions_follow_githubs_rules(text, expected):
    assert evaluate(text, CONTEXT, STATUS) == expected


def test_unknown_functions_and_contexts_are_refused():
    with pytest.raises(ExpressionError):
        evaluate("hashFiles('x')", CONTEXT, STATUS)
    with pytest.raises(ExpressionError):
        evaluate("nosuch.thing", CONTEXT, STATUS)


def test_an_if_without_a_status_function_implies_success():
    failed = {**STATUS, "success": lambda: False, "failure": lambda: True}
    assert condition("vars.ON == 'true'", CONTEXT, STATUS)
    assert not condition("vars.ON == 'true'", CONTEXT, failed)
    assert condition("always() && vars.ON == 'true'", CONTEXT, failed)
    assert substitute("${{ matrix.stack }}-x", CONTEXT) == "core012-x"


def test_matrix_include_follows_the_documented_example():
    """docs.github.com, "Expanding or adding matrix configurations"."""
    job = {"strategy": {"matrix": {"fruit": ["apple", "pear"], "animal": ["cat", "dog"], "include": [
        {"color": "green"}, {"color": "pink", "animal": "cat"}, {"fruit": "apple", "shape": "circle"},
        {"fruit": "banana"}, {"fruit": "banana", "animal": "cat"}]}}}
    assert matrix_rows(job) == [
        {"fruit": "apple", "animal": "cat", "color": "pink", "shape": "circle"},
        {"fruit": "apple", "animal": "dog", "color": "green", "shape": "circle"},
        {"fruit": "pear", "animal": "cat", "color": "pink"},
        {"fruit": "pear", "animal": "dog", "color": "green"},
        {"fruit": "banana"}, {"fruit": "banana", "animal": "cat"}]
    only_include = {"strategy": {"matrix": {"include": [{"lane": "a"}, {"lane": "b"}]}}}
    assert matrix_rows(only_include) == [{"lane": "a"}, {"lane": "b"}]


WORKFLOW = """\
name: rehearsal-self-test
on:
  workflow_dispatch:
    inputs:
      flavour: {type: string, default: plain}
jobs:
  first:
    runs-on: ubuntu-latest
    outputs:
      word: ${{ steps.say.outputs.word }}
    steps:
      - id: say
        run: |
          echo "word=hello-${{ inputs.flavour }}" >>"$GITHUB_OUTPUT"
          echo "CARRIED=yes" >>"$GITHUB_ENV"
      - name: the env file carries to the next step
        run: test "$CARRIED" = yes
      - name: no pipefail without a named shell (GitHub runs bash -e)
        run: false | true
  second:
    needs: first
    runs-on: ubuntu-latest
    steps:
      - name: reads the output of first
        run: test "${{ needs.first.outputs.word }}" = hello-plain
      - name: a failing step that goes on
        continue-on-error: true
        run: exit 3
      - name: still runs
        run: "true"
      - name: the failing step
        run: exit 4
      - name: skipped after a failure
        run: "true"
      - name: runs after a failure
        if: always()
        run: "true"
  third:
    needs: second
    runs-on: ubuntu-latest
    steps:
      - run: "true"
  fourth:
    needs: second
    if: ${{ !cancelled() }}
    runs-on: self-hosted-nothing
    steps:
      - run: "true"
  pipefail:
    runs-on: ubuntu-latest
    steps:
      - shell: bash
        run: false | true
"""


def test_a_small_workflow_runs_as_github_runs_it(tmp_path):
    path = tmp_path / "wf.yml"
    path.write_text(textwrap.dedent(WORKFLOW))
    workflow = load(path)
    assert order(workflow) == ["first", "second", "third", "fourth", "pipefail"]
    stage = Stage(ROOT, tmp_path / "work", "workflow_dispatch", dispatch_defaults(workflow, {}), {}, {}, {}, {})
    results = {r.job: r for r in run_workflow(stage, workflow)}
    assert results["first"].result == "success", [(s.name, s.note) for s in results["first"].steps]
    assert results["first"].outputs == {"word": "hello-plain"}
    second = [(s.name, s.outcome, s.conclusion) for s in results["second"].steps]
    assert second == [("reads the output of first", "success", "success"),
                      ("a failing step that goes on", "failure", "success"),
                      ("still runs", "success", "success"),
                      ("the failing step", "failure", "failure"),
                      ("skipped after a failure", "skipped", "skipped"),
                      ("runs after a failure", "success", "success")]
    assert results["second"].result == "failure"
    assert results["third"].result == "skipped"  # success() of its needs is false
    assert results["fourth"].result == "failure"  # it runs, on a runner the rehearsal does not have
    assert "no such runner" in results["fourth"].why
    assert results["pipefail"].result == "failure"  # `shell: bash` is bash -eo pipefail


def test_an_undeclared_dispatch_input_is_refused(tmp_path):
    path = tmp_path / "wf.yml"
    path.write_text(textwrap.dedent(WORKFLOW))
    with pytest.raises(ValueError, match="declares no input nosuch"):
        dispatch_defaults(load(path), {"nosuch": "1"})


def test_a_container_job_runs_offline_on_the_runner_sets_emulated_cards(tmp_path):
    path = tmp_path / "wf.yml"
    path.write_text(textwrap.dedent("""\
        name: container
        on: workflow_dispatch
        jobs:
          device:
            runs-on: linux-aarch64-a3-16
            container:
              image: some/image:tag
            steps:
              - run: |
                  test "$PARITY_EMULATED_NPU_CARDS" = 16
                  test "$PIP_NO_INDEX" = 1
                  test "$(command -v python3)" = "$IMAGE_BIN/python3"
        """))
    image = tmp_path / "image" / "bin"
    image.mkdir(parents=True)
    (image / "python3").symlink_to(sys.executable)
    workflow = load(path)
    stage = Stage(ROOT, tmp_path / "work", "workflow_dispatch", {}, {}, {"some/image:tag": image}, {},
                  {"IMAGE_BIN": str(image)})
    [result] = run_workflow(stage, workflow)
    assert result.result == "success", [(s.name, s.note, s.log.read_text() if s.log else "") for s in result.steps]
    stage.images = {}
    [missing] = run_workflow(stage, workflow)
    assert missing.result == "failure" and "no image standing in" in missing.why
