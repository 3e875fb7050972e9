"""``distrec predict``: the click probability of every row of a data file, from a trained
model (any checkpoint kind) or an exported program, streamed batch by batch into a file.

Memory stays bounded whatever the input's size: the input is parsed into distrec's
memory-mapped data cache (as ``train`` and ``evaluate`` read it, malformed rows skipped and
counted alike), scored one batch at a time and appended to the scores file
(``distrec.serving.scores_file``); a Hotline run's disk tier stays memory-mapped. Each score
carries its row's position in the input, skipped rows counted (``Dataset.input_positions``).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.export.graph_signature import InputKind
from tqdm import tqdm

from distrec.allocator import keep_freed_memory
from distrec.config import RunConfig
from distrec.data.batch import Batch
from distrec.data.inputs import path_list
from distrec.data.source import MalformedRows
from distrec.errors import DistrecError
from distrec.serving.inputs import INPUT_NAMES, JaggedInputs
from distrec.serving.manifest import read_manifest
from distrec.serving.program import ServingModel
from distrec.serving.scores_file import ScoresWriter, scores_format
from distrec.tables import TableConfig
from distrec.train.evaluate import default_device, load_trained_model, scoring_dataset


@dataclass
class Predictor:
    """A model ready to score batches, and the data it reads.

    Attributes:
        model: ``(dense, values, lengths) ->`` click probabilities float32 [B], in the signature
            of ``distrec.serving.inputs``: a trained model in a ``ServingModel``, or an exported program's module.
        cfg: the settings of the run that trained it (``cfg.data``: format, schema, table sizes).
        tables: its tables, in feature order.
        num_dense: its dense features.
        source: the checkpoint folder or program file it came from.
        device: where its inputs go.
        dense_transforms: the transforms its run fitted to the dense columns (``distrec.data.dense_transforms``).
    """

    model: nn.Module
    cfg: RunConfig
    tables: list[TableConfig]
    num_dense: int
    source: str
    device: torch.device
    dense_transforms: list[dict]

    @classmethod
    def from_checkpoint(cls, checkpoint: Path) -> Predictor:
        """The model of a run (its best one if it kept one, else its last) or checkpoint folder, as ``evaluate`` scores it."""
        device = default_device()
        model, cfg, tables, meta = load_trained_model(checkpoint, device, best=True)
        return cls(ServingModel(model).eval(), cfg, tables, meta["num_dense"], meta["checkpoint"], device, meta.get("dense_transforms", []))

    @classmethod
    def from_program(cls, path: Path) -> Predictor:
        """A program written by ``distrec export`` (a trusted file: loading it runs its graph), with its JSON."""
        exported = read_manifest(path)
        fix = "pass a .pt2 file written by 'distrec export'"
        if exported.program_format != "torch.export":
            raise DistrecError(f"{str(path)!r} is an {exported.program_format} model; predict runs torch.export programs: export with --format pt2")
        try:
            program = torch.export.load(path)
        except Exception as e:  # torch.export.load raises whatever its archive reader met
            raise DistrecError(f"{str(path)!r} is not a torch.export program ({type(e).__name__}); {fix}") from None
        inputs = [spec.arg.name for spec in program.graph_signature.input_specs if spec.kind == InputKind.USER_INPUT]
        if inputs != list(INPUT_NAMES):
            raise DistrecError(f"{str(path)!r} takes inputs {inputs}, not {list(INPUT_NAMES)}; {fix}")
        return cls(program.module(), exported.cfg, exported.tables, exported.num_dense, str(path), torch.device("cpu"), exported.dense_transforms)

    def score(self, batch: Batch) -> np.ndarray:
        """Click probabilities of the samples of ``batch``: float32 [B]."""
        return self.model(*JaggedInputs.of_batch(batch.to(self.device))).float().cpu().numpy()


@torch.no_grad()
def predict_file(
    predictor: Predictor,
    out: Path,
    data_path: str | None,
    data_format: str | None = None,
    schema: str | None = None,
    cache_dir: str | None = None,
    strict: bool | None = None,
    batch_size: int = 16384,
    progress: bool = True,
) -> dict[str, Any]:
    """Score every row of ``data_path`` (in ``data_format``; without it, the data the model was
    trained on) and write ``out`` (.parquet or .csv, see ``distrec.serving.scores_file``).

    Returns what was done: the scores file, rows scored, samples scored per second (reading,
    scoring and writing, once the model and the data cache are ready), malformed rows skipped
    (and the first of their lines, per file for several files), the model's source.

    Raises:
        DistrecError: ``out`` is neither .parquet nor .csv, or the data cannot be read or
            has other features than the model (nothing is written).
    """
    scores_format(out)
    if predictor.device.type == "cpu":
        keep_freed_memory()  # each batch's activations reuse freed heap, not fresh pages (distrec.allocator)
    dataset = scoring_dataset(
        predictor.cfg, predictor.tables, predictor.num_dense, data_path, data_format, schema, cache_dir, strict, progress, predictor.dense_transforms
    )
    paths = path_list(predictor.cfg.data.path)
    name = Path(paths[0]).name if len(paths) == 1 else f"{len(paths)} paths" if paths else predictor.cfg.data.format
    started = time.perf_counter()
    with (
        ScoresWriter(out) as writer,
        tqdm(total=dataset.num_rows, unit=" rows", unit_scale=True, desc=f"predicting {name}", disable=None if progress else True) as bar,
    ):
        for batch in dataset.batches(None, batch_size, shuffle=False):
            scores = predictor.score(batch)
            positions = dataset.input_positions(np.arange(writer.rows, writer.rows + len(scores)))
            writer.write(positions, scores, batch.labels.numpy())
            bar.update(len(scores))
    seconds = time.perf_counter() - started
    return {
        "scores": str(out),
        "rows": writer.rows,
        "samples_per_s": writer.rows / seconds if seconds > 0 else 0.0,
        "malformed_rows": sum(m.count for m in dataset.malformed),
        "malformed_lines": _first_malformed_lines(dataset.malformed),
        "model": predictor.source,
    }


def _first_malformed_lines(malformed: list[MalformedRows]) -> list[int] | dict[str, list[int]]:
    """The first skipped lines of the input file, or for several files, of each that skipped rows."""
    if len(malformed) == 1:
        return [line for line, _ in malformed[0].first]
    return {m.path: [line for line, _ in m.first] for m in malformed if m.count}
