"""Save and load trained interventions: ``reft_config.json`` + ``interventions.safetensors`` in one folder.

Kept out of `method.py` (which does no file I/O). The tensors are each intervention's ``state_dict`` under the key
prefix ``intervention_<i>.``; the JSON records the `ReftConfig`, each intervention's class and its constructor
settings, so `load_interventions` rebuilds the same modules.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from torch import nn

from lmlab.methods.adaptation.d_reft.method import DLoreftIntervention, LoreftIntervention, ReftConfig


def _settings(iv: nn.Module) -> dict[str, Any]:
    out: dict[str, Any] = {"class": type(iv).__name__, "d": iv.d, "rank": iv.rank}
    if isinstance(iv, DLoreftIntervention):
        out.update(logvar_clamp=list(iv.logvar_clamp), sigma_clamp=list(iv.sigma_clamp),
                   sample_at_eval=iv.sample_at_eval, kl_beta=iv.kl_beta)  # fmt: skip
    return out


def save_interventions(path: str | Path, config: ReftConfig, interventions: nn.Module | Sequence[nn.Module]) -> Path:
    """Write `interventions` (one module or a list) and `config` to the folder `path` (created); returns it."""
    from safetensors.torch import save_file

    ivs = [interventions] if isinstance(interventions, nn.Module) else list(interventions)
    if not ivs:
        raise ValueError("save_interventions needs at least one intervention, got none")
    for iv in ivs:
        if not isinstance(iv, LoreftIntervention):
            raise ValueError(
                f"can only save LoreftIntervention / DLoreftIntervention modules, got {type(iv).__name__}"
            )
    folder = Path(path)
    folder.mkdir(parents=True, exist_ok=True)
    tensors = {f"intervention_{i}.{k}": v.detach().contiguous().cpu() for i, iv in enumerate(ivs)
               for k, v in iv.state_dict().items()}  # fmt: skip
    save_file(tensors, str(folder / "interventions.safetensors"))
    meta = {"reft_config": asdict(config), "interventions": [_settings(iv) for iv in ivs]}
    (folder / "reft_config.json").write_text(json.dumps(meta, indent=2))
    return folder


def load_interventions(path: str | Path) -> tuple[ReftConfig, list[nn.Module]]:
    """Read a folder written by `save_interventions`: ``(config, interventions)`` in eval mode."""
    from safetensors.torch import load_file

    folder = Path(path)
    meta_file, tensor_file = folder / "reft_config.json", folder / "interventions.safetensors"
    if not meta_file.is_file() or not tensor_file.is_file():
        raise ValueError(f"{folder} must hold reft_config.json and interventions.safetensors (save_interventions)")
    meta = json.loads(meta_file.read_text())
    config = ReftConfig(**meta["reft_config"])
    tensors = load_file(str(tensor_file))
    ivs: list[nn.Module] = []
    for i, s in enumerate(meta["interventions"]):
        if s["class"] == "DLoreftIntervention":
            iv: nn.Module = DLoreftIntervention(s["d"], s["rank"], logvar_clamp=tuple(s["logvar_clamp"]),
                                                sigma_clamp=tuple(s["sigma_clamp"]),
                                                sample_at_eval=s["sample_at_eval"], kl_beta=s["kl_beta"])  # fmt: skip
        elif s["class"] in ("LoReFTIntervention", "LoreftIntervention"):
            iv = LoreftIntervention(s["d"], s["rank"])
        else:
            raise ValueError(f"intervention {i}: unknown class {s['class']!r} (expected LoReFT or D-LoReFT)")
        prefix = f"intervention_{i}."
        iv.load_state_dict({k[len(prefix) :]: v for k, v in tensors.items() if k.startswith(prefix)})
        ivs.append(iv.eval())
    return config, ivs
