"""A workflow's `${{ vars.QWEN3_8B_PATH }}` of an unset repository variable is "", and Path("") is the working
directory: an empty variable reads exactly as an unset one, naming it. The planted input is the empty variable (as
the workflow sets it); the clean twin the variable set to a directory."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from parity.harness.config import validate
from parity.harness.config.errors import ScenarioError
from parity.harness.config.models import expand_model_path
from parity.harness.contract.schema import Scenario

pytestmark = pytest.mark.torch_free

VAR = "PARITY_TEST_CHECKPOINT_PATH"
GOLDEN = "golden:$PARITY_GOLDEN_DIR/qwen3-8b__fsdp2__dp8__bf16__cuda"


@pytest.mark.parametrize("model", [f"${VAR}", f"${{{VAR}}}", f"${{{VAR}}}/Qwen3-8B"])
@pytest.mark.parametrize("value", ["", None], ids=["empty", "unset"])
def test_an_empty_model_variable_is_refused_as_an_unset_one_naming_it(monkeypatch, model, value):
    if value is None:
        monkeypatch.delenv(VAR, raising=False)
    else:
        monkeypatch.setenv(VAR, value)
    said = "is empty" if value == "" else "is not set"
    assert expand_model_path(model) == model  # never "" (the working directory) nor "/Qwen3-8B" (the root's)
    assert validate.model_path_problem(model) == f"model path {model}: environment variable {VAR} {said}"
    row = Scenario(model=model, strategy="hf")
    with pytest.raises(ScenarioError, match=f"key 'model'.*{VAR} {said}"):
        validate.check_environment(row)  # a row that would run here: bad input, named
    npu = row.model_copy(update={"device": "npu"})  # a row that SKIPs here says so too
    assert f"environment variable {VAR} {said}" in validate.skip_reason(npu)


def test_the_clean_twin_a_variable_naming_a_directory_runs(monkeypatch, tmp_path):
    monkeypatch.setenv(VAR, str(tmp_path))
    assert expand_model_path(f"${{{VAR}}}/sub") == f"{tmp_path}/sub"
    assert validate.model_path_problem(f"${VAR}") is None
    validate.check_environment(Scenario(model=f"${VAR}", strategy="hf"))


@pytest.mark.parametrize("value", ["", None], ids=["empty", "unset"])
def test_an_empty_golden_directory_variable_names_it(monkeypatch, value):
    if value is None:
        monkeypatch.delenv("PARITY_GOLDEN_DIR", raising=False)
    else:
        monkeypatch.setenv("PARITY_GOLDEN_DIR", value)
    reason = validate.missing_golden(Scenario(model="tiny-qwen3", strategy="hf", reference=GOLDEN))
    said = "is empty" if value == "" else "is not set"
    assert f"(its directory variable PARITY_GOLDEN_DIR {said})" in reason, reason
    assert "/qwen3-8b__fsdp2__dp8__bf16__cuda has no" not in reason  # not the root's directory


@pytest.mark.parametrize(("value", "expected"), [("", "/tmp/parity-cards"), ("/tmp/elsewhere", "/tmp/elsewhere")])
def test_an_empty_card_lock_dir_is_the_default_not_the_working_directory(tmp_path, value, expected):
    done = subprocess.run([sys.executable, "-c", "from parity.harness.run import cards; print(cards.DEFAULT_LOCK_DIR)"],
                          env={**os.environ, "PARITY_CARD_LOCK_DIR": value}, cwd=tmp_path, capture_output=True,
                          text=True, timeout=60, check=True)
    assert done.stdout.strip() == expected
