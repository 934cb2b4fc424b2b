"""attnbench's own temporary files: none stays beside a user's files once a command has ended."""

import threading

from attnbench.results.store import ResultStore


def test_a_new_store_leaves_only_itself(tmp_path):
    """The store is built under a temporary name and linked into place; the temporary name goes (it stayed,
    a second hard link to the store, after every store made)."""
    ResultStore(tmp_path / "s.db").close()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.db"]
    made = []

    def make():
        ResultStore(tmp_path / "t.db").close()
        made.append(True)
    threads = [threading.Thread(target=make) for _ in range(4)]  # several processes make one store at once
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert made == [True] * 4
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.db", "t.db"]
