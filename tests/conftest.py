import os
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
os.environ.setdefault("WANDB_SILENT", "true")
os.environ.setdefault("WANDB_MODE", "offline")
os.environ.setdefault("WANDB_DISABLE_GIT", "true")


def attention_schemes() -> list[str]:
    return sorted(p.stem for p in (ROOT / "conf" / "attention").glob("*.yaml"))


@pytest.fixture(params=attention_schemes())
def scheme(request):
    return request.param
