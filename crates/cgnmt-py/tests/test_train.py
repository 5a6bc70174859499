"""`cgnmt.train` trains as `cgnmt train` does, resumes, refuses bad configurations; `cgnmt.select`; the
examples under examples/python run."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

import cgnmt
from conftest import REPO, run


def tiny(prepared, **extra):
    s = {
        "data.prepared": str(prepared),
        "model.embedding_dim": 8,
        "model.hidden_dim": 12,
        "model.attention_dim": 8,
        "train.batch_size": 16,
        "train.max_steps": 20,
        "train.eval_every": 10,
        "train.eval_max_sentences": 10,
        "train.eval_beam": 2,
        "train.threads": 1,
        "train.optimizer": "adam",
    }
    s.update(extra)
    return s


def test_train_equals_the_command_line_and_resumes(prepared, cgnmt_bin, tmp_path):
    s = tiny(prepared)
    py = cgnmt.train(set=s, out=tmp_path / "py", quiet=True)
    assert py.steps == 20 and py.parameters > 0 and len(py.history) == 2
    assert py.best_dev_bleu is not None and py.state["finished"]
    args = ["train", "-q", "--out", tmp_path / "cli"]
    for k, v in s.items():
        # The command line's form of each setting (TOML values: bools, numbers, quoted strings).
        v = ("true" if v else "false") if isinstance(v, bool) else repr(v) if isinstance(v, (int, float)) else json.dumps(v)
        args += ["--set", f"{k}={v}"]
    run(cgnmt_bin, *args)
    # The same updates: the same bits.
    assert (tmp_path / "py/last/model.safetensors").read_bytes() == (
        tmp_path / "cli/last/model.safetensors"
    ).read_bytes()
    # Ten updates, then ten more with resume=True: the uninterrupted run's parameters.
    cgnmt.train(set=tiny(prepared, **{"train.max_steps": 10}), out=tmp_path / "half", quiet=True)
    more = cgnmt.train(set={"train.max_steps": 20}, out=tmp_path / "half", resume=True, quiet=True)
    assert more.steps == 20
    assert (tmp_path / "half/last/model.safetensors").read_bytes() == (
        tmp_path / "py/last/model.safetensors"
    ).read_bytes()


def test_train_refuses_bad_settings_with_python_exceptions(prepared, tmp_path):
    with pytest.raises(ValueError, match="model.decoder"):
        cgnmt.train(set=tiny(prepared, **{"model.decoder": "lstm"}), out=tmp_path / "x", quiet=True)
    with pytest.raises(ValueError):
        cgnmt.train(set=tiny(prepared, **{"train.label_smoothing": 1.5}), out=tmp_path / "y", quiet=True)
    with pytest.raises(FileNotFoundError):
        cgnmt.train(config=tmp_path / "no.toml", out=tmp_path / "z", quiet=True)
    with pytest.raises(FileNotFoundError, match="resume"):
        cgnmt.train(out=tmp_path / "never-trained", resume=True, quiet=True)
    with pytest.raises(TypeError):
        cgnmt.train(set={"train.seed": [1, 2]}, out=tmp_path / "w", quiet=True)


def test_select_chooses_on_dev(prepared, tmp_path):
    cgnmt.train(
        set=tiny(prepared, **{"train.keep_checkpoints": 2, "train.exponential_smoothing": 0.01}),
        out=tmp_path / "run",
        quiet=True,
    )
    sel = cgnmt.select(tmp_path / "run", tune=False, dev_sentences=10, beam=2)
    names = [c["name"] for c in sel["candidates"]]
    assert "best" in names and 0 <= sel["chosen"] < len(names)
    assert json.loads((tmp_path / "run" / "selection.json").read_text())["chosen"] == sel["chosen"]
    # The penalties chosen on dev's longer pairs, under a length-ratio constraint.
    tuned = cgnmt.select(tmp_path / "run", tune=True, dev_sentences=60, beam=2, tune_longer_than=5,
                         length_ratio=(0.9, 1.1))
    assert tuned["tuning"] == {"longer_than": 5, "length_ratio": [0.9, 1.1]}
    assert 0 < tuned["tuning_sentences"] < 60 and len(tuned["grid"]) == 10
    chosen = [g for g in tuned["grid"] if (g[0], g[1]) == (tuned["length_penalty"], tuned["coverage_penalty"])]
    inside = [g for g in tuned["grid"] if 0.9 <= g[3] <= 1.1]
    if inside:
        assert chosen[0][2] == max(g[2] for g in inside) and 0.9 <= chosen[0][3] <= 1.1
    with pytest.raises(ValueError, match="tune=True"):
        cgnmt.select(tmp_path / "run", tune_longer_than=5)
    with pytest.raises(ValueError, match="low <= high"):
        cgnmt.select(tmp_path / "run", tune=True, length_ratio=(1.2, 1.0))


def test_the_examples_run(models, tmp_path):
    from conftest import DATA

    ex = REPO / "examples" / "python"
    src = tmp_path / "src.zh"
    src.write_text("".join(l + "\n" for l in (DATA / "dev.zh").read_text(encoding="utf-8").splitlines()[100:130]),
                   encoding="utf-8")
    ref = tmp_path / "ref.en"
    ref.write_text("".join(l + "\n" for l in (DATA / "dev.en").read_text(encoding="utf-8").splitlines()[100:130]),
                   encoding="utf-8")

    def py(*args):
        p = subprocess.run([sys.executable, *map(str, args)], capture_output=True, text=True, timeout=300)
        assert p.returncode == 0, p.stderr
        return p.stdout

    py(ex / "translate_file.py", models[0], src, tmp_path / "out.en", "--beam", "5")
    assert len((tmp_path / "out.en").read_text(encoding="utf-8").splitlines()) == 30
    out = py(ex / "figure6.py", models[0], "日本比加拿大小。", "--png", tmp_path / "fig.png")
    assert "gate" in out
    py(ex / "gate_stats.py", models[0], src, ref, tmp_path / "gates.csv")
    rows = (tmp_path / "gates.csv").read_text().splitlines()
    assert rows[0].startswith("line,") and len(rows) == 31


def test_ctrl_c_stops_training_with_its_checkpoint_saved_and_resume_continues(prepared, tmp_path):
    import os
    import signal
    import threading

    s = tiny(prepared, **{"train.max_steps": 100000, "train.eval_every": 0, "train.save_every": 0})
    timer = threading.Timer(1.5, lambda: os.kill(os.getpid(), signal.SIGINT))
    timer.start()
    with pytest.raises(KeyboardInterrupt):
        cgnmt.train(set=s, out=tmp_path / "run", quiet=True)
    timer.join()
    state = json.loads((tmp_path / "run" / "last" / "train_state.json").read_text())
    assert 0 < state["step"] < 100000 and not state["finished"]
    more = cgnmt.train(set={"train.max_steps": state["step"] + 5}, out=tmp_path / "run", resume=True, quiet=True)
    assert more.steps == state["step"] + 5


def test_fine_tuning_starts_from_the_model(prepared, tmp_path):
    base = cgnmt.train(set=tiny(prepared), out=tmp_path / "base", quiet=True)
    tuned = cgnmt.train(
        set={"data.prepared": str(prepared), "train.max_steps": 10, "train.eval_every": 5,
             "train.eval_max_sentences": 10, "train.eval_beam": 2, "train.threads": 1},
        out=tmp_path / "tuned", init=tmp_path / "base", quiet=True,
    )
    # The first evaluation is the model's own, at update 0; the architecture came from the model.
    assert [h["step"] for h in tuned.history] == [0, 5, 10]
    assert tuned.history[0]["dev_bleu"] == base.best_dev_bleu  # (init takes the run's best/ model)
    assert tuned.parameters == base.parameters
    with pytest.raises(ValueError, match="architecture"):
        cgnmt.train(set={"data.prepared": str(prepared), "model.hidden_dim": 16}, out=tmp_path / "x",
                    init=tmp_path / "base", quiet=True)
    with pytest.raises(FileNotFoundError):
        cgnmt.train(set={"data.prepared": str(prepared)}, out=tmp_path / "y", init=tmp_path / "nothing",
                    quiet=True)


def test_a_deep_model_trains_and_translates_from_python(prepared, tmp_path):
    """Stacked encoders and a deep transition (`model.encoder_layers`, `model.decoder_transition_depth`) from
    Python: the summary counts their parameters, and the model translates with attention and gates."""
    plain = cgnmt.train(set=tiny(prepared, **{"train.max_steps": 4}), out=tmp_path / "plain", quiet=True)
    deep = cgnmt.train(
        set=tiny(
            prepared,
            **{"train.max_steps": 4, "model.encoder_layers": 2, "model.decoder_transition_depth": 2},
        ),
        out=tmp_path / "deep",
        quiet=True,
    )
    h = 12
    # One more bidirectional layer over 2H-wide annotations, one more state-only GRU.
    upper = 2 * (2 * h * 3 * h + h + 2 * h * h + h * h)
    later = 3 * h + 2 * h * h + h * h
    assert deep.parameters - plain.parameters == upper + later
    tr = cgnmt.Translator(tmp_path / "deep" / "last")
    out = tr.translate(["我们应该坐下。", "日本比加拿大小。"], beam=3, return_attention=True, return_gates=True)
    assert len(out) == 2
    for t in out:
        assert t.attention.shape[1] == len(t.source_tokens) + 1
        assert t.gates.shape == (len(t.tokens),)


def test_a_layer_normalised_model_trains_and_translates_from_python(prepared, tmp_path):
    """`model.layer_norm` from Python: the summary counts the gains and biases (12H per encoder GRU, 18H in
    the transition, 4·Ad in the attention, 6H in the readout), and the model translates with attention."""
    plain = cgnmt.train(set=tiny(prepared, **{"train.max_steps": 4}), out=tmp_path / "plain", quiet=True)
    normed = cgnmt.train(
        set=tiny(prepared, **{"train.max_steps": 4, "model.layer_norm": True}),
        out=tmp_path / "ln",
        quiet=True,
    )
    h, ad = 12, 8
    assert normed.parameters - plain.parameters == 2 * 12 * h + 18 * h + 4 * ad + 6 * h
    tr = cgnmt.Translator(tmp_path / "ln" / "last")
    out = tr.translate(["我们应该坐下。", "日本比加拿大小。"], beam=3, return_attention=True)
    assert len(out) == 2
    for t in out:
        assert t.attention.shape[1] == len(t.source_tokens) + 1
