"""attnbench from Python: the same runs as the command line, records back for a notebook (``docs/api.md``).

``plan(**options)`` validates options into a ``RunPlan`` — the frozen run configuration that ``attnbench run``,
its ``--config`` YAML, ``--preset`` and ``--resume`` all build, through the same code — and ``run(plan)``
executes it, writing each record to the store as it is measured, and returns the records. Options are the
command line's, by parameter name (the YAML keys): ``seq_lens``, ``backends``, ``causal`` (or ``causal_mode``),
``pass_`` (or ``pass``), ``preset``, a feature by its name (its value as in YAML; a list of values is an axis), ``device``, ``db``...
A value may be a scalar or a list, as in YAML. Bad input raises ``ValueError`` with the CLI's one-line message.

``verify(**options)`` is ``attnbench verify``: the bug-prone shapes unless shapes are given (``op=`` or an
operator's ``preset``: that operator's), one call each, every record checked. ``frame(records)`` is a pandas DataFrame of the export columns.
"""

from __future__ import annotations

from pathlib import Path

from attnbench.results.record import Record

__all__ = ["frame", "plan", "run", "verify"]


def _options(options: dict, command, where: str) -> dict:
    """``options`` by the command line's parameter names (YAML's spellings too), refused (ValueError) where
    ``command`` (``attnbench run``'s or ``verify``'s function) has no such option, as a YAML key is."""
    import inspect

    from attnbench.cli import common
    out = {}
    for key, value in options.items():
        name = str(key).replace("-", "_")
        name = common.CONFIG_ALIASES.get(name, name)
        out[name] = str(value) if isinstance(value, Path) else value
    # --resume and --shard are the command line's (a resumed run's options come from its store; run() runs the
    # whole sweep in this process)
    allowed = set(inspect.signature(command).parameters) - {"ctx", "config", "resume", "shard"}
    common.check_known(out, allowed, where)
    return out


def plan(**options):
    """The validated ``RunPlan`` of ``options`` (nothing runs, nothing is written)."""
    from attnbench.cli.run import plan_from_options
    from attnbench.cli.run import run as command
    return plan_from_options(_options(options, command, "attnbench.plan's options"))


def run(plan_or_none=None, /, *, run_id: str | None = None, quiet: bool = True, **options) -> list[Record]:
    """Run a plan (or ``plan(**options)``) and return its records, as ``attnbench run`` stores them (under
    ``run_id`` if given, else the plan's ``run_id``), and to the plan's ``output`` file if it has one;
    ``quiet=False`` prints the progress lines ``run`` prints."""
    from attnbench.cli.run import RunPlan, execute
    from attnbench.results.store import check_run_id
    if plan_or_none is not None and not isinstance(plan_or_none, RunPlan):
        raise TypeError(f"attnbench.run takes a plan (attnbench.plan(...)) or options by name, not a "
                        f"{type(plan_or_none).__name__}: {plan_or_none!r:.60}")
    if plan_or_none is not None and options:
        raise TypeError(f"attnbench.run takes a plan or options, not both: give {', '.join(options)} to "
                        "attnbench.plan")
    if run_id is not None:  # refused before anything is written, as the command line's --run-id is
        check_run_id(run_id, "run_id")
    the_plan = plan_or_none if plan_or_none is not None else plan(**options)
    run_id = run_id if run_id is not None else the_plan.config.get("run_id")
    checker = None
    if the_plan.config.get("check", True) is not False:
        from attnbench.accuracy.check import AccuracyChecker
        checker = AccuracyChecker(grads_ahead=any(s.pass_ != "fwd" for s in the_plan.specs))
    run_id, records, _ = execute(the_plan, run_id=run_id, quiet=quiet, checker=checker)
    if the_plan.output is not None:
        from attnbench.cli.common import write_output
        write_output(records, the_plan.output, the_plan.db, run_id)
    return records


def verify(**options) -> list[Record]:
    """``attnbench verify``'s records: outputs and gradients against the exact reference."""
    from attnbench.cli.verify import execute_checks, verify_plan
    from attnbench.cli.verify import verify as command
    _, records = execute_checks(verify_plan(_options(options, command, "attnbench.verify's options")))
    return records


def frame(records: list[Record]):
    """The records as a pandas DataFrame, one row per record, the export's columns."""
    import pandas as pd

    from attnbench.results import export
    if isinstance(records, Record):
        records = [records]
    try:
        records = list(records)
    except TypeError:
        raise TypeError(f"attnbench.frame takes a list of records, not a {type(records).__name__}") from None
    wrong = [r for r in records if not isinstance(r, Record)]
    if wrong:
        raise TypeError(f"attnbench.frame takes the records of attnbench.run or verify, not a "
                        f"{type(wrong[0]).__name__}: {wrong[0]!r:.60}")
    return pd.DataFrame(export.export_rows([r.to_row() for r in records]))
