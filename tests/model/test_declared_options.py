"""Each option's type and range is declared once, in the annotation of the constructor or section
class that takes it (nas_cli/pipeline/sections.py says where); the pre-flight reads them there and
keeps no table of its own."""
from __future__ import annotations

import math
from pathlib import Path

import pytest
from helpers import compose_cfg

from nas_cli.errors import UserError
from nas_cli.infra.options import Count, Fraction, NonNegativeNumber, PositiveInt, PositiveNumber, type_problem
from nas_cli.pipeline import sections as sec
from nas_cli.pipeline.checks.config import check_config

ROOT = Path(__file__).resolve().parents[2]

#: the keys nas-run has always refused bad values of before anything is made
CHECKED = {"seed", "threads", "model.heads", "model.d_model", "model.ffn", "model.encoder_layers",
           "model.decoder_layers", "model.max_len", "model.dropout", "optim.lr", "optim.warmup",
           "optim.label_smoothing", "optim.weight_decay", "task.batch_size", "task.eval_batch_size",
           "task.max_tokens", "task.eval_max_tokens", "task.tokens_per_sample", "task.vocab_size", "task.beam",
           "task.train_size", "trainer.max_steps", "trainer.max_epochs", "trainer.accumulate_grad_batches",
           "trainer.val_check_interval", "checkpoint.last_every_n_steps", "checkpoint.every_n_steps",
           "checkpoint.keep_last", "diagnostics.batches"}


def _declared(cfg) -> dict[str, list[type]]:
    from nas_cli.infra.options import declared_types

    out: dict[str, list[type]] = {}
    for prefix, owner in sec.sections(cfg):
        for name in declared_types(owner):
            out.setdefault(f"{prefix}.{name}" if prefix else name, []).append(owner)
    return out


def test_every_checked_option_is_declared_by_what_takes_it_and_the_checks_keep_no_table():
    found: dict[str, list[type]] = {}
    for overrides in [(), ("task=iwslt14",), ("task=wikitext2",)]:
        found.update(_declared(compose_cfg(*overrides)))
    assert CHECKED <= set(found), CHECKED - set(found)
    assert found["task.max_tokens"][0].__name__ == "TranslationTask"
    assert found["task.tokens_per_sample"][0].__name__ == "LanguageModelTask"
    assert {c.__name__ for c in found["model.heads"]} == {"Seq2SeqTransformer", "DecoderOnlyLM"}
    assert found["optim.lr"] == [sec.OptimOptions] and found["seed"] == [sec.RunOptions]
    text = (ROOT / "nas_cli" / "pipeline" / "checks" / "config.py").read_text()
    assert "RULES" not in text and "lambda v" not in text


def _number(v) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def _integer(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


@pytest.mark.parametrize("hint,reference", [
    (PositiveInt, lambda v: _integer(v) and v > 0),
    (Count, lambda v: _integer(v) and v >= 0),
    (Fraction, lambda v: _number(v) and 0 <= v < 1),
    (PositiveNumber, lambda v: _number(v) and v > 0),
    (NonNegativeNumber, lambda v: _number(v) and v >= 0),
    (sec.Seed, lambda v: _integer(v) and 0 <= v < 2 ** 32),
    (sec.Steps, lambda v: _integer(v) and (v == -1 or v > 0)),
    (sec.Threads | None, lambda v: v is None or (_integer(v) and v > 0)),
    (sec.Interval | None, lambda v: v is None or (_integer(v) and v > 0) or (_number(v) and 0 < v <= 1)),
])
def test_a_declared_range_accepts_exactly_what_a_plain_comparison_does(hint, reference):
    values = [-2, -1, 0, 1, 2, 2 ** 32 - 1, 2 ** 32, 0.0, 0.5, 1.0, 1.5, -0.5, True, False, None, "3", "abc",
              float("inf"), float("nan"), [1]]
    for v in values:
        assert (type_problem(v, hint) is None) == reference(v), (hint, v, type_problem(v, hint))


@pytest.mark.parametrize("override,key,what", [
    ("checkpoint.keep_last=0", "checkpoint.keep_last", "a positive integer (e.g. checkpoint.keep_last=1)"),
    ("checkpoint.every_n_steps=-1", "checkpoint.every_n_steps", "an integer >= 0 or null"),
    ("trainer.accumulate_grad_batches=0", "trainer.accumulate_grad_batches", "a positive integer"),
    ("trainer.val_check_interval=0", "trainer.val_check_interval", "in (0, 1], or null"),
    ("diagnostics.batches=0", "diagnostics.batches", "a positive integer (e.g. diagnostics.batches=2)"),
    ("optim.eps=0", "optim.eps", "a number > 0"),
    ("task.val_size=0", "task.val_size", "a positive integer (e.g. task.val_size=500)"),
    ("model.heads=2.5", "model.heads", "a positive integer (e.g. model.heads=8)"),
    ("task=iwslt14 task.max_tokens=0", "task.max_tokens", "a positive integer (e.g. task.max_tokens=4096)"),
])
def test_a_value_outside_its_declared_range_is_one_line_naming_it(override, key, what):
    with pytest.raises(UserError) as err:
        check_config(compose_cfg(*override.split()))
    message = str(err.value)
    assert message.startswith(f"{key}=") and " is not valid: it must be " in message and what in message, message
    assert "\n" not in message


def test_a_plugin_task_declares_its_own_ranges(tmp_path, monkeypatch):
    """A task from outside the package annotates its constructor; the pre-flight refuses a value
    out of that range in the same one line, and knows nothing else about the task."""
    (tmp_path / "my_sized.py").write_text(
        "from typing import Annotated\n\n"
        "from nas_cli.infra.options import Check\n"
        "from tasks.synthetic import SyntheticSeq2Seq\n\n\n"
        "class Sized(SyntheticSeq2Seq):\n"
        "    def __init__(self, window: Annotated[int, Check(lambda v: v % 2 == 0, 'an even integer', '4')] = 4,"
        " **kw):\n"
        "        super().__init__(**kw)\n"
        "        self.window = window\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    base = ("task._target_=my_sized.Sized",)
    check_config(compose_cfg(*base, "+task.window=6"))
    with pytest.raises(UserError, match=r"^task.window=3 is not valid: it must be an even integer \(e.g. "
                                        r"task.window=4\)$"):
        check_config(compose_cfg(*base, "+task.window=3"))
    with pytest.raises(UserError, match=r"^task.batch_size=0 is not valid: it must be a positive integer"):
        check_config(compose_cfg(*base, "task.batch_size=0"))  # the parent's declaration, through **kw


def test_a_scheme_option_declares_its_range_in_its_annotation(tmp_path, monkeypatch):
    """docs/extending.md: ``power: PositiveNumber`` stops ``attention.power=-1`` in one line naming the
    scheme, the option, what it takes and an example."""
    (tmp_path / "my_sharp_range.py").write_text(
        "from nas_cli.attention.base import AttentionCore\n"
        "from nas_cli.infra.options import PositiveNumber\n\n\n"
        "class Sharpened(AttentionCore):\n"
        "    def __init__(self, heads, power: PositiveNumber = 2.0, **kw):\n"
        "        super().__init__(heads, **kw)\n"
        "        self.power = float(power)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    base = ("attention._target_=my_sharp_range.Sharpened", "attention.name=sharpened")
    check_config(compose_cfg(*base, "+attention.power=0.5"))
    with pytest.raises(UserError) as err:
        check_config(compose_cfg(*base, "+attention.power=-1"))
    assert str(err.value) == ("attention.power=-1: sharpened's option 'power' takes a number > 0 (e.g. "
                              "attention.power=1e-3)")


def test_the_diagnostics_section_is_the_callbacks_options_and_a_typo_is_refused():
    """A key of the diagnostics section that the callback does not take (from an experiment's YAML; the
    command line refuses ``+diagnostics.<typo>=`` before Hydra starts) is one line with the closest
    name, not a warning. Every packaged experiment's diagnostics section passes."""
    from nas_cli.pipeline.checks.config import check_declared

    with pytest.raises(UserError, match=r"^diagnostics.bacthes=3: the diagnostics section has no option 'bacthes' "
                                        r"\(did you mean diagnostics.batches\?\)"):
        check_declared(compose_cfg("+diagnostics.bacthes=3"))
    for experiment in sorted(p.stem for p in (ROOT / "conf" / "experiment").glob("*.yaml")):
        check_declared(compose_cfg(f"experiment={experiment}"))
