"""Contract tests every scheme in conf/attention/ gets for free: the checks of
nas_cli/model/contract.py (the same ones ``nas-bench check-scheme`` runs on a user's scheme),
each on every packaged scheme, filtered by the scheme's declared flags."""
import pytest
from omegaconf import OmegaConf

from nas_cli.model import contract
from nas_cli.model.choices import CONF_DIR


@pytest.mark.parametrize("check", list(contract.CHECKS))
def test_contract(scheme, check):
    applied = contract.run_check(OmegaConf.load(CONF_DIR / "attention" / f"{scheme}.yaml"), check)
    if not applied:
        pytest.skip(f"{check} does not apply to {scheme}'s declared flags")


def test_a_broken_scheme_fails_the_checks_that_catch_it():
    """The checks are not vacuous: a scheme that lets a query see later keys, and one whose rows
    do not sum to 1, are each caught, with what went wrong."""
    leaky = {"_target_": "nas_cli.attention.base.AttentionCore", "name": "leaky"}
    import torch

    from nas_cli.attention.base import AttentionCore

    class Leaky(AttentionCore):
        name = "leaky"

        def weights_from_logits(self, logits, allowed):  # ignores the mask: sees the future and the padding
            return torch.softmax(logits, -1)

    class Unnormalized(AttentionCore):
        name = "unnormalized"

        def weights_from_logits(self, logits, allowed):
            return torch.sigmoid(logits) if allowed is None else torch.sigmoid(logits) * allowed

    import sys
    import types

    mod = types.ModuleType("contract_fixtures")
    mod.Leaky, mod.Unnormalized = Leaky, Unnormalized
    sys.modules["contract_fixtures"] = mod
    try:
        leaky["_target_"] = "contract_fixtures.Leaky"
        with pytest.raises(contract.ContractError, match="the future leaks"):
            contract.run_check(leaky, "causal_t3")
        with pytest.raises(contract.ContractError, match="padding changed real outputs"):
            contract.run_check(leaky, "padding")
        bad = {"_target_": "contract_fixtures.Unnormalized", "name": "unnormalized"}
        with pytest.raises(contract.ContractError, match="each query's weights must sum to 1"):
            contract.run_check(bad, "rows")
    finally:
        del sys.modules["contract_fixtures"]


def test_a_scheme_has_one_name(scheme):
    """The file's stem, the YAML's ``name`` and the built core's name are one name (the tag in
    every table, the W&B tags and the error messages)."""
    from helpers import build_core

    cfg = OmegaConf.load(CONF_DIR / "attention" / f"{scheme}.yaml")
    assert cfg.name == scheme
    assert build_core(scheme).name == scheme == build_core(scheme).scheme_name()
