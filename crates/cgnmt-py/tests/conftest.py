"""Shared fixtures: two tiny models trained with the package itself (`cgnmt.prepare`, `cgnmt.train`) on the
400 Tatoeba zh-en pairs bundled in `tests/data/` (one with a context gate on both sides and a coverage model,
one with the gate only, from the same prepared data: an ensemble), so that every test of the package needs
only the package; and, for the tests that compare with them, the `cgnmt` command line and the metric oracles
of ../shared. Without those, such tests are skipped; with `CGNMT_REQUIRE_ALL=1` (as `.ci/run` sets) they fail
instead."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import cgnmt

REPO = Path(__file__).resolve().parents[3]


DATA = Path(__file__).resolve().parent / "data"


def _data_dir() -> Path:
    d = os.environ.get("CGNMT_DATA")
    return Path(d) if d else REPO.parent / "shared" / "data"


def missing(what: str) -> None:
    """A test's outside requirement is missing: skip it, or fail under `CGNMT_REQUIRE_ALL=1`."""
    if os.environ.get("CGNMT_REQUIRE_ALL") == "1":
        pytest.fail(what)
    pytest.skip(what)


def installed_cli() -> Path:
    """The `cgnmt` command the package installed beside this interpreter (its console script)."""
    return Path(sys.executable).parent / "cgnmt"


@pytest.fixture(scope="session")
def cgnmt_bin() -> Path:
    """The command-line tool: `CGNMT_BIN` when set, else the package's own `cgnmt` command (installed with it),
    else the binary built from the same checkout (`cargo build --release`)."""
    env = os.environ.get("CGNMT_BIN")
    b = Path(env) if env else installed_cli()
    if not env and not b.is_file():
        b = REPO / "target" / "release" / "cgnmt"
    if not b.is_file():
        missing(f"{b}: no cgnmt command to compare with (cargo build --release, or set CGNMT_BIN)")
    return b


@pytest.fixture(scope="session")
def fixtures_dir() -> Path:
    d = Path(os.environ.get("CGNMT_SHARED", REPO.parent / "shared")) / "fixtures"
    if not d.is_dir():
        missing(f"{d}: the metric fixtures are missing (set CGNMT_SHARED to the shared/ directory)")
    return d


def run(cgnmt_bin: Path, *args: str, **kw) -> subprocess.CompletedProcess:
    """`cgnmt ARGS` under a timeout; a failure fails the test with its standard error."""
    p = subprocess.run(
        [str(cgnmt_bin), *map(str, args)], capture_output=True, timeout=600, **kw
    )
    if p.returncode != 0:
        pytest.fail(f"cgnmt {' '.join(map(str, args))} failed:\n{p.stderr.decode()}")
    return p


@pytest.fixture(scope="session")
def tatoeba() -> Path:
    t = _data_dir() / "tatoeba-zh-en"
    if not (t / "train.zh").is_file():
        missing(f"{t}: Tatoeba zh-en is missing (set CGNMT_DATA)")
    return t


@pytest.fixture(scope="session")
def prepared(tmp_path_factory) -> Path:
    """The bundled pairs prepared in this process (as `cgnmt prepare` would)."""
    out = tmp_path_factory.mktemp("prep") / "prepared"
    summary = cgnmt.prepare(
        DATA / "train.zh", DATA / "train.en", out, dev_src=DATA / "dev.zh", dev_tgt=DATA / "dev.en", force=True
    )
    assert summary["train"]["pairs_kept"] == 400
    return out


def _train(prepared: Path, out: Path, seed: int, extra: dict) -> cgnmt.TrainSummary:
    settings = {
        "data.prepared": str(prepared),
        "model.embedding_dim": 16,
        "model.hidden_dim": 24,
        "model.attention_dim": 16,
        "model.decoder": "gru",
        "model.context_gate": "both",
        "train.batch_size": 16,
        "train.max_steps": 150,
        "train.eval_every": 0,
        "train.eval_max_sentences": 20,
        "train.eval_beam": 2,
        "train.threads": 1,
        "train.seed": seed,
        "train.optimizer": "adam",
        "train.learning_rate": 0.01,
    }
    settings.update(extra)
    return cgnmt.train(set=settings, out=out, quiet=True)


@pytest.fixture(scope="session")
def models(tmp_path_factory, prepared) -> tuple:
    """(gated + coverage model's run directory, gated model's run directory), trained in this process."""
    root = tmp_path_factory.mktemp("runs")
    a = _train(prepared, root / "a", 1, {"model.coverage": "neural"})
    b = _train(prepared, root / "b", 2, {})
    assert a.steps == 150 and b.steps == 150
    return Path(a.run_dir), Path(b.run_dir)


@pytest.fixture(scope="session")
def dev_lines() -> list:
    """100 raw dev sentences (Chinese) of the bundled data, and an empty line among them."""
    lines = (DATA / "dev.zh").read_text(encoding="utf-8").splitlines()[:100]
    lines.insert(17, "")
    return lines
