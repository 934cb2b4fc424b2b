"""attnbench from Python: the same runs as the command line, records back for a notebook (``docs/api.md``).

``plan(**options)`` validates options into a ``RunPlan`` — the frozen run configuration that ``attnbench run``,
its ``--config`` YAML, ``--preset`` and ``--resume`` all build, through the same code — and ``run(plan)``
executes it, writing each record to the store as it is measured, and returns the records. Options are the
command line's, by parameter name (the YAML keys): ``seq_lens``, ``backends``, ``causal`` (or ``causal_mode``),
``pass_`` (or ``pass``), ``preset``, a feature by its name (its value as in YAML; a list of values is an axis), ``device``, ``db``...
A value may be a scalar or a list, as in YAML. Bad input raises ``ValueError`` with the CLI's one-line message.

``verify(**options)`` is ``attnbench verify``: the bug-prone shapes unless shapes are given, one call each,
every record checked. ``frame(records)`` is a pandas DataFrame of the export columns.
"""

from __future__ import annotations

from pathlib import Path

from attnbench.results.record import Record

__all__ = ["frame", "plan", "run", "verify"]


def _options(options: dict) -> dict:
    from attnbench.cli import common
    out = {}
    for key, value in options.items():
        name = str(key).replace("-", "_")
        name = common.CONFIG_ALIASES.get(name, name)
        out[name] = str(value) if isinstance(value, Path) else value
    return out


def plan(**options):
    """The validated ``RunPlan`` of ``options`` (nothing runs, nothing is written)."""
    from attnbench.cli.run import plan_from_options
    return plan_from_options(_options(options))


def run(plan_or_none=None, /, *, run_id: str | None = None, quiet: bool = True, **options) -> list[Record]:
    """Run a plan (or ``plan(**options)``) and return its records, as ``attnbench run`` stores them (under
    ``run_id`` if given); ``quiet=False`` prints the progress lines ``run`` prints."""
    from attnbench.cli.run import execute
    from attnbench.results.store import check_run_id
    if run_id is not None:  # refused before anything is written, as the command line's --run-id is
        check_run_id(run_id, "run_id")
    the_plan = plan_or_none if plan_or_none is not None else plan(**options)
    checker = None
    if the_plan.config.get("check", True) is not False:
        from attnbench.accuracy.check import AccuracyChecker
        checker = AccuracyChecker(grads_ahead=any(s.pass_ != "fwd" for s in the_plan.specs))
    _, records, _ = execute(the_plan, run_id=run_id, quiet=quiet, checker=checker)
    return records


def verify(**options) -> list[Record]:
    """``attnbench verify``'s records: outputs and gradients against the exact reference."""
    from attnbench.cli.verify import execute_checks, verify_plan
    _, records = execute_checks(verify_plan(_options(options)))
    return records


def frame(records: list[Record]):
    """The records as a pandas DataFrame, one row per record, the export's columns."""
    import pandas as pd

    from attnbench.results import export
    return pd.DataFrame(export.export_rows([r.to_row() for r in records]))
