"""Names and texts that come from a file or a store (a trace step's name, a backend, a reason, a command) are
shown as the characters they hold: rich markup in them is not interpreted (nor fails the command), terminal
escape sequences and other control characters never reach the terminal, and the HTML report escapes them."""

import json
import re

import pytest
from results_fixtures import cli, synthetic_record

from attnbench.report import safe_text
from attnbench.results.record import Record
from attnbench.results.store import ResultStore
from attnbench.spec import AttnSpec

NAMES = ["[/bold]", "\x1b[2J\x1b[Hclear", "[link=file:///etc/passwd]x[/link] [red]red", "\x1b]0;pwned\x07title",
         "bidi \u202eevil"]
RUN = ["--device", "cpu", "--backends", "naive", "--q-heads", "1", "--head-size", "8", "--dtype", "fp32",
       "--warmup", "0", "--repeat", "1"]
CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e]")


def _shown_plainly(res):
    out = res.stdout + res.stderr
    assert res.returncode == 0, res.stderr
    assert not CONTROL.search(out), repr(CONTROL.search(out))
    assert "MarkupError" not in out
    return out


@pytest.fixture
def trace(tmp_path):
    path = tmp_path / "trace.jsonl"
    path.write_text("".join(json.dumps({"name": name, "requests": [[i + 1, 8]]}) + "\n"
                            for i, name in enumerate(NAMES)))
    return path


def test_a_traces_names_are_shown_as_text_by_run_and_show(tmp_path, trace):
    db = tmp_path / "r.db"
    out = _shown_plainly(cli("run", *RUN, "--batch-trace", trace, "--db", db))
    for shown in ("[/bold]", "clear", "[link=file:///etc/passwd]x[/link] [red]red", "title", "bidi ?evil"):
        assert shown in out, (shown, out)
    assert "pwned" not in out  # a terminal title, dropped with its sequence
    for args in (["show"], ["show", "--table"], ["runs"]):
        out = _shown_plainly(cli(*args, "--db", db))
        if args == ["show"]:
            assert "[/bold]" in out and "[link=file:///etc/passwd]x[/link] [red]red" in out, out


@pytest.fixture
def hostile_store(tmp_path):
    db = tmp_path / "h.db"
    with ResultStore(db) as store:
        store.add_env("env", {"device_name": "GPU \x1b[31m[bold]red[/]"})
        store.start_run("r1", command="attnbench run \x1b[2J [/] \x07", config={}, env_id="env", version="t")
        spec = AttnSpec(seqlens_q=(16,), heads_q=2, head_dim=8, dtype="fp32", pass_="fwd")
        store.write(synthetic_record("r1", spec, "naive", [1.0, 1.1], info={"batch_name": NAMES[0]}))
        store.write(synthetic_record("r1", spec, "[/b]\x1b[5mblink", [1.2, 1.3], info={"batch_name": NAMES[0]}))
        store.write(Record(run_id="r1", backend="broken", spec=AttnSpec(seqlens_q=(32,), heads_q=2, head_dim=8,
                                                                        dtype="fp32", pass_="fwd"),
                           status="error", reason="[/red] \x1b]8;;file:///etc/passwd\x07link\x1b]8;;\x07 <b>"))
        store.finish_run("r1")
    return db


def test_what_a_store_holds_is_shown_as_text(hostile_store):
    out = _shown_plainly(cli("runs", "--db", hostile_store))
    assert "[/]" in out and "GPU [bold]red" in out  # a device name cut to its column
    out = _shown_plainly(cli("runs", "--full", "--db", hostile_store))
    assert "[/]" in out and "[bold]red[/]" in out
    out = _shown_plainly(cli("show", "--table", "--db", hostile_store))
    assert "[/b]blink" in out and "[/red]" in out and "link" in out
    out = _shown_plainly(cli("show", "--db", hostile_store))
    assert "[/b]" in out and "[/bold]" in out


def test_the_html_report_holds_no_control_characters(tmp_path, hostile_store):
    res = cli("report", "--db", hostile_store, "-o", tmp_path / "r.html")
    assert res.returncode == 0, res.stderr
    page = (tmp_path / "r.html").read_text()
    assert not CONTROL.search(page), repr(CONTROL.search(page))
    assert "&lt;b&gt;" in page and "<b>\x1b" not in page and "[/red]" in page


@pytest.mark.parametrize("text, shown", [
    ("\x1b[2J\x1b[Hx", "x"), ("a\x1b]0;title\x07b", "ab"), ("a\x1b]8;;http://x\x1b\\b", "ab"), ("\x1bcreset", "reset"),
    ("a\x9b31mb", "ab"), ("tab\tand\nline", "tab\tand\nline"), ("bell\x07 del\x7f nul\x00", "bell? del? nul?"),
    ("\u202eevil", "?evil"), ("plain [bold] text", "plain [bold] text"),
])
def test_clean_drops_sequences_and_marks_control_characters(text, shown):
    assert safe_text.clean(text) == shown


def test_markup_html_and_the_console_show_text_as_it_is():
    assert safe_text.markup("[/bold] [link=x]") == "\\[/bold] \\[link=x]"
    assert safe_text.html("<a href='x'>\x1b[1m") == "&lt;a href=&#x27;x&#x27;&gt;"
    console = safe_text.SafeConsole(width=80, force_terminal=False)
    with console.capture() as got:
        console.print("[/bold] closes nothing \x1b[2J")
        console.print(":smile: [bold]ours[/]")
    assert got.get() == "[/bold] closes nothing \n:smile: ours\n"
