"""The sandbox's bookkeeping (crewlet.sandbox), without running bubblewrap:
what a turn leaves set, what an install walk remembers and shows, where a
hidden path is covered. What a confined tool can reach is
tests/integration/test_sandbox.py's, with real bwrap.
"""

from __future__ import annotations

import asyncio
import os

import pytest

from crewlet import sandbox


def script(path: str, text: str) -> str:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        f.write(text)
    os.chmod(path, 0o755)
    return path


def replace(path: str, text: str) -> None:
    """Write *path* anew, as an upgrade does: another file renamed over it."""
    script(path + ".new", text)
    os.replace(path + ".new", path)


# ------------------------------------------------------------------ a turn's seat

def test_a_turns_seat_and_grant_are_set_for_the_turn_only():
    """The seats role runs a seat's turns one after another in one task: the
    seat (and its turn's grant, its bridge token) must not outlive its turn."""
    box = sandbox.Sandbox(data_dir="/nonexistent")
    first = sandbox.Seat(box, "a", grant="grant-1")
    assert sandbox.SEAT.get() is None
    with sandbox.turn(first):
        assert sandbox.SEAT.get() is first
        with pytest.raises(RuntimeError):
            with sandbox.turn(sandbox.Seat(box, "a", grant="grant-2")):
                raise RuntimeError("the turn failed")
        assert sandbox.SEAT.get() is first  # an inner turn that failed is gone, the outer stays
    assert sandbox.SEAT.get() is None

    async def seat_task() -> list:
        seen = []
        for n in range(2):
            with sandbox.turn(sandbox.Seat(box, "a", grant=f"grant-{n}")):
                # What the turn's own tasks (a provider call) see: this turn's.
                seen.append(await asyncio.create_task(_current_grant()))
            seen.append(sandbox.SEAT.get())  # between turns: nothing
        return seen
    assert asyncio.run(seat_task()) == ["grant-0", None, "grant-1", None]


async def _current_grant():
    seat = sandbox.SEAT.get()
    return seat.grant if seat is not None else None


# ------------------------------------------------------------------ install walks

def test_an_install_walk_is_done_again_when_the_program_changes(tmp_path):
    """An upgraded tool (its file replaced, naming another interpreter) gets
    its new install bound, not the one remembered from before."""
    one = os.path.join(tmp_path, "one", "bin", "sh")
    two = os.path.join(tmp_path, "two", "bin", "sh")
    for link in (one, two):
        os.makedirs(os.path.dirname(link))
        os.symlink("/bin/sh", link)
    tool = script(os.path.join(tmp_path, "app", "bin", "tool"), f"#!{one}\necho one\n")
    app = os.path.join(tmp_path, "app")
    assert sorted(sandbox.installs([tool])) == sorted([app, os.path.join(tmp_path, "one")])
    assert sorted(sandbox.installs([tool])) == sorted([app, os.path.join(tmp_path, "one")])  # remembered
    replace(tool, f"#!{two}\necho two\n")
    assert sorted(sandbox.installs([tool])) == sorted([app, os.path.join(tmp_path, "two")])
    # Its interpreter's link moved: walked again too.
    os.unlink(two)
    os.symlink(one, two)
    assert sorted(sandbox.installs([tool])) == sorted([app, os.path.join(tmp_path, "one"),
                                                       os.path.join(tmp_path, "two")])


def test_a_venv_given_another_editable_install_is_walked_again(tmp_path):
    venv, checkout = os.path.join(tmp_path, "venv"), os.path.join(tmp_path, "src")
    site = os.path.join(venv, "lib", "python3.11", "site-packages")
    os.makedirs(site)
    with open(os.path.join(venv, "pyvenv.cfg"), "w") as f:
        f.write("home = /usr/bin\n")
    tool = script(os.path.join(venv, "bin", "tool"), "#!/bin/sh\n")
    script(os.path.join(checkout, "pkg", "__init__.py"), "")
    assert sandbox.installs([tool]) == [venv]
    with open(os.path.join(site, "dev.pth"), "w") as f:
        f.write(checkout + "\n")
    assert sorted(sandbox.installs([tool])) == sorted([venv, os.path.join(checkout, "pkg")])


def test_the_walks_remembered_are_bounded(tmp_path, monkeypatch):
    monkeypatch.setattr(sandbox, "INSTALLS_KEPT", 3)
    tools = [script(os.path.join(tmp_path, f"t{n}", "bin", "tool"), "#!/bin/sh\n") for n in range(5)]
    for tool in tools:
        sandbox.installs([tool])
    assert len(sandbox._walked) == 3 and (tools[-1],) in sandbox._walked and (tools[0],) not in sandbox._walked


def test_a_prefix_shared_with_a_persons_files_shows_only_its_code(tmp_path, monkeypatch):
    """~/.cargo, ~/.local, ~/bin: the code directories, not the credentials
    and data beside them; a venv or a conda environment there is shown whole;
    a deeper prefix (~/.pyenv/versions/x) is an install of its own."""
    home = os.path.join(tmp_path, "home")
    monkeypatch.setenv("HOME", home)
    cargo = script(os.path.join(home, ".cargo", "bin", "tool"), "#!/bin/sh\n")
    local = script(os.path.join(home, ".local", "bin", "tool"), "#!/bin/sh\n")
    os.makedirs(os.path.join(home, ".local", "lib", "python3.11"))
    os.makedirs(os.path.join(home, ".local", "share", "keyrings"))
    mine = script(os.path.join(home, "bin", "tool"), "#!/bin/sh\n")
    loose = script(os.path.join(home, "tool"), "#!/bin/sh\n")
    conda = script(os.path.join(home, "miniconda3", "bin", "tool"), "#!/bin/sh\n")
    os.makedirs(os.path.join(home, "miniconda3", "conda-meta"))
    pyenv = script(os.path.join(home, ".pyenv", "versions", "3.11", "bin", "python"), "#!/bin/sh\n")
    assert sandbox.installs([cargo]) == [os.path.join(home, ".cargo", "bin")]
    assert sorted(sandbox.installs([local])) == [os.path.join(home, ".local", d) for d in ("bin", "lib")]
    assert sandbox.installs([mine]) == [os.path.join(home, "bin")]
    assert sandbox.installs([loose]) == [loose]
    assert sandbox.installs([conda]) == [os.path.join(home, "miniconda3")]
    assert sandbox.installs([pyenv]) == [os.path.join(home, ".pyenv", "versions", "3.11")]


def test_a_checkout_a_pth_line_names_shows_what_python_imports_of_it(tmp_path):
    venv, checkout = os.path.join(tmp_path, "venv"), os.path.join(tmp_path, "checkout")
    site = os.path.join(venv, "lib", "python3.11", "site-packages")
    os.makedirs(site)
    with open(os.path.join(venv, "pyvenv.cfg"), "w") as f:
        f.write("home = /usr/bin\n")
    with open(os.path.join(site, "dev.pth"), "w") as f:
        f.write(f"{checkout}\nimport os\nrelative/path\n")
    tool = script(os.path.join(venv, "bin", "tool"), "#!/bin/sh\n")
    for name in ("pkg/__init__.py", "ns/sub/__init__.py", "mod.py", "ext.cpython-311-x86_64-linux-gnu.so",
                 "pkg.egg-info/PKG-INFO", ".env", ".git/config", "notes/secret.txt", "README"):
        script(os.path.join(checkout, name), "")
    shown = {os.path.relpath(p, checkout) for p in sandbox.installs([tool]) if p != venv}
    assert shown == {"pkg", "ns", "mod.py", "ext.cpython-311-x86_64-linux-gnu.so", "pkg.egg-info"}


def test_paths_named_in_arguments_show_their_directory_never_etc_nor_a_shared_one(tmp_path, monkeypatch):
    home = os.path.join(tmp_path, "home")
    monkeypatch.setenv("HOME", home)
    server = script(os.path.join(tmp_path, "tools", "server.py"), "")
    at_home = script(os.path.join(home, "server.py"), "")
    named = sandbox._named_paths([server, f"--config={at_home}", "/etc/hostname", "/etc/ssl",
                                  "--x=/etc/passwd", home, "relative", "/nonexistent/x"])
    assert named == [os.path.dirname(server), at_home]  # the home's file alone, nothing of /etc


def test_a_hidden_path_is_covered_where_it_shows_inside():
    """A root bound at a path with a link in it shows the data dir under that
    path, not under its resolved one: the cover goes where it shows."""
    assert sandbox._covers("/srv/app/var/data", ["/srv/app"]) == ["/srv/app/var/data"]
    assert sandbox._covers("/srv/app/var/data", ["/srv/other"]) == []
    assert sandbox._covers("/", ["/srv/app"]) == []


def test_covers_follow_a_linked_root(tmp_path):
    real = os.path.join(tmp_path, "app")
    os.makedirs(os.path.join(real, "var", "data"))
    link = os.path.join(tmp_path, "applink")
    os.symlink(real, link)
    hidden = os.path.realpath(os.path.join(real, "var", "data"))
    assert sandbox._covers(hidden, [link]) == [os.path.join(link, "var", "data")]
