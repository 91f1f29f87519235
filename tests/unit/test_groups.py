"""The consumer-group table (crewlet/groups.py) held against the code, both ways.

Static half (no broker): the code under crewlet/, roles/ and supervisor/ is
read with :mod:`ast`, not imported.

(a) every row of the table is used: passed as the group (first argument) of
    ``groups.durable(ROW, ...)`` — naming a consumer the code makes — or of
    ``groups.check_attach(ROW, ...)`` — refusing a node that may not attach —
    somewhere outside crewlet/groups.py. A row only imported or mentioned
    is a group the table claims and the code no longer has;
(b) every durable consumer the code creates or binds to is named by
    ``groups.durable(ROW, ...)``: either directly at the call, or through a
    name (or ``self.<attr>``) every assignment of which in that function
    (class, module) is such a call. A consumer named any other way is a group
    the table does not know, and nothing stops a stateless node attaching.

What counts as creating or binding a durable consumer (:func:`durable_sites`):
a ``durable_name=`` keyword (``ConsumerConfig``, ``add_consumer``, ``dict``);
a ``"durable_name"`` key of a dict literal (the raw JSON API, as the
mailboxes use it); ``durable`` of ``pull_subscribe`` / ``subscribe`` and the
consumer of ``pull_subscribe_bind`` / ``subscribe_bind``, by keyword or
position. An ordered consumer (``ordered_consumer=True``) is ephemeral and
nobody's group; a durable of ``None`` is none. A JetStream push ``subscribe``
with only ``queue=`` also makes a durable of that name — the scan cannot tell
it from a core-NATS queue group, so it is not looked for.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from crewlet import groups
from crewlet.groups import CUSTODY, GROUPS, MAILBOX, Group, GroupRefused

ROOT = Path(__file__).resolve().parents[2]
SCANNED = ("crewlet", "roles", "supervisor")
TABLE = ROOT / "crewlet" / "groups.py"
MODULE = "crewlet.groups"

# The row constants of the table: module-level names bound to a Group.
ROWS = {name: value for name, value in vars(groups).items() if isinstance(value, Group)}

# The table's functions whose group (first argument) is a row in use: the
# consumer's name is made from it, or a node is refused attaching to it.
USES = ("durable", "check_attach")

# Calls whose durable name is an argument: method -> (keywords, position).
NAMED_BY = {
    "pull_subscribe": (("durable",), 1),
    "subscribe": (("durable",), 3),
    "pull_subscribe_bind": (("consumer", "durable"), 0),
    "subscribe_bind": (("consumer",), 2),
}


def sources() -> list[tuple[str, ast.Module]]:
    out = []
    for top in SCANNED:
        for path in sorted((ROOT / top).rglob("*.py")):
            if path != TABLE:
                out.append((str(path.relative_to(ROOT)), ast.parse(path.read_text(), str(path))))
    return out


# ------------------------------------------------------------------ how a module names the table

class Names:
    """How one module refers to crewlet.groups: as a module (``groups``, an
    alias, ``crewlet.groups``) or by names imported from it."""

    def __init__(self, tree: ast.Module):
        self.modules: set[str] = set()
        self.imported: dict[str, str] = {}  # local name -> name in crewlet.groups
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.module == "crewlet":
                self.modules |= {a.asname or a.name for a in node.names if a.name == "groups"}
            elif isinstance(node, ast.ImportFrom) and node.module == MODULE:
                self.imported.update({a.asname or a.name: a.name for a in node.names})
            elif isinstance(node, ast.Import):
                for a in node.names:
                    if a.name == MODULE:
                        self.modules.add(a.asname or MODULE)

    def resolve(self, expr: ast.AST) -> str | None:
        """The crewlet.groups name *expr* refers to (``groups.durable`` -> 'durable'), else None."""
        if isinstance(expr, ast.Name):
            return self.imported.get(expr.id)
        if isinstance(expr, ast.Attribute) and dotted(expr.value) in self.modules:
            return expr.attr
        return None


def dotted(expr: ast.AST) -> str | None:
    if isinstance(expr, ast.Name):
        return expr.id
    if isinstance(expr, ast.Attribute):
        base = dotted(expr.value)
        return None if base is None else f"{base}.{expr.attr}"
    return None


def rows_used(tree: ast.Module) -> set[str]:
    """The rows *tree* passes as the group of a :data:`USES` call of the table."""
    names = Names(tree)
    used: set[str] = set()
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and names.resolve(node.func) in USES):
            continue
        group = node.args[0] if node.args else next(
            (k.value for k in node.keywords if k.arg == "group"), None)
        row = names.resolve(group) if group is not None else None
        if row in ROWS:
            used.add(row)
    return used


# ------------------------------------------------------------------ where durable consumers are made

def _is_none(expr: ast.AST | None) -> bool:
    return expr is None or (isinstance(expr, ast.Constant) and expr.value is None)


def durable_sites(tree: ast.Module) -> list[tuple[int, ast.AST]]:
    """(line, the expression naming the durable) for every place *tree*
    creates or binds a durable consumer."""
    sites: list[tuple[int, ast.AST]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Dict):
            for key, value in zip(node.keys, node.values):
                if isinstance(key, ast.Constant) and key.value == "durable_name" and not _is_none(value):
                    sites.append((node.lineno, value))
        if not isinstance(node, ast.Call):
            continue
        keywords = {k.arg: k.value for k in node.keywords if k.arg}
        ordered = keywords.get("ordered_consumer")
        if isinstance(ordered, ast.Constant) and ordered.value is True:
            continue
        if not _is_none(keywords.get("durable_name")):
            sites.append((node.lineno, keywords["durable_name"]))
        method = node.func.attr if isinstance(node.func, ast.Attribute) else None
        if method in NAMED_BY:
            names, position = NAMED_BY[method]
            value = next((keywords[k] for k in names if k in keywords), None)
            if value is None and len(node.args) > position and not any(
                    isinstance(a, ast.Starred) for a in node.args[:position + 1]):
                value = node.args[position]
            if not _is_none(value):
                sites.append((node.lineno, value))
    return sites


def _parents(tree: ast.Module) -> dict[ast.AST, ast.AST]:
    return {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}


def _enclosing(node: ast.AST, parents: dict, kinds: tuple) -> ast.AST | None:
    while node in parents:
        node = parents[node]
        if isinstance(node, kinds):
            return node
    return None


def _assigned(scope: ast.AST, matches) -> list[ast.AST | None]:
    """The values assigned, within *scope*, to targets ``matches(target)``
    says are the one looked for (None for a binding with no plain value:
    a loop variable, an augmented assignment, a tuple unpacking)."""
    values: list[ast.AST | None] = []
    for node in ast.walk(scope):
        if isinstance(node, ast.Assign):
            for target in node.targets:
                if matches(target):
                    values.append(node.value)
                elif isinstance(target, (ast.Tuple, ast.List)) and any(matches(t) for t in target.elts):
                    values.append(None)
        elif isinstance(node, (ast.AnnAssign, ast.NamedExpr)) and matches(node.target):
            values.append(node.value)
        elif isinstance(node, (ast.AugAssign, ast.For, ast.AsyncFor)) and matches(node.target):
            values.append(None)
    return values


def from_table(expr: ast.AST, tree: ast.Module, names: Names, parents: dict) -> bool:
    """Whether *expr* is ``groups.durable(...)``, or a name / ``self.<attr>``
    bound only to such calls in its function (class; module for a name)."""
    def is_durable_call(value: ast.AST | None) -> bool:
        return isinstance(value, ast.Call) and names.resolve(value.func) == "durable"

    if is_durable_call(expr):
        return True
    if isinstance(expr, ast.Name):
        scope = _enclosing(expr, parents, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)) or tree
        values = _assigned(scope, lambda t: isinstance(t, ast.Name) and t.id == expr.id)
        if not values and scope is not tree:  # not bound here: a module-level constant?
            values = [v for v in _assigned(tree, lambda t: isinstance(t, ast.Name) and t.id == expr.id)
                      if _enclosing(v, parents, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)) is None]
        return bool(values) and all(is_durable_call(v) for v in values)
    if isinstance(expr, ast.Attribute) and dotted(expr.value) == "self":
        cls = _enclosing(expr, parents, (ast.ClassDef,))
        if cls is None:
            return False
        values = _assigned(cls, lambda t: isinstance(t, ast.Attribute) and dotted(t.value) == "self"
                           and t.attr == expr.attr)
        return bool(values) and all(is_durable_call(v) for v in values)
    return False


def consumers_outside_table(tree: ast.Module) -> list[tuple[int, str]]:
    """(line, the naming expression) of each durable consumer of *tree* not named by the table."""
    names, parents = Names(tree), _parents(tree)
    return [(line, ast.unparse(expr)) for line, expr in durable_sites(tree)
            if not from_table(expr, tree, names, parents)]


# ------------------------------------------------------------------ the table against the code

def test_every_row_has_a_constant_and_is_used_in_the_code():
    assert set(ROWS.values()) == set(GROUPS), "every row of GROUPS is a module constant, and only they"
    used: dict[str, list[str]] = {}
    for path, tree in sources():
        for name in rows_used(tree):
            used.setdefault(name, []).append(path)
    unused = sorted(set(ROWS) - set(used))
    assert not unused, (f"rows of crewlet/groups.py no durable(ROW, ...) or check_attach(ROW, ...) "
                        f"call uses: {', '.join(unused)} — a group the table claims but nothing creates; "
                        "remove the row or name the consumer with it where it is made")


def test_every_durable_consumer_in_the_code_is_named_by_the_table():
    strays = [f"{path}:{line}: {expr}" for path, tree in sources()
              for line, expr in consumers_outside_table(tree)]
    assert not strays, ("durable consumers not named by crewlet.groups.durable(ROW, ...):\n  "
                        + "\n  ".join(strays))


# ------------------------------------------------------------------ the scan itself, on small sources

def scan(source: str) -> list[tuple[int, str]]:
    return consumers_outside_table(ast.parse(source))


def test_scan_accepts_consumers_named_by_the_table():
    assert scan("""
from crewlet import groups
from crewlet.groups import durable as name_of, CUSTODY
from nats.js.api import ConsumerConfig

KEPT = groups.durable(groups.CUSTODY)

class Keeper:
    def __init__(self, js):
        self.js = js
        self.durable = name_of(CUSTODY)

    async def start(self):
        await self.js.pull_subscribe("events.>", self.durable, stream="EVENTS")

async def mailbox(js, api, seat):
    name = groups.durable(groups.MAILBOX, seat=seat)
    await api("CONSUMER.CREATE", {"name": name, "durable_name": name})
    await js.add_consumer("AGENTS", ConsumerConfig(durable_name=groups.durable(groups.MAILBOX, seat=seat)))
    await js.pull_subscribe_bind(durable=name, stream="AGENTS")
    await js.subscribe("events.>", durable=KEPT)

async def log(js):
    await js.subscribe("estate.ops", ordered_consumer=True)
    await js.pull_subscribe("x.>", None, stream="X")
    await js.add_consumer("X", ConsumerConfig(durable_name=None, deliver_policy="all"))
    await nc.subscribe("agents.inbox.*", cb=print)
""") == []


def test_scan_finds_consumers_named_any_other_way():
    found = scan("""
from crewlet import groups
from nats.js.api import ConsumerConfig

class Keeper:
    def __init__(self, seat):
        self.durable = "inbox-" + seat

    async def start(self, js):
        await js.subscribe_bind("EVENTS", ConsumerConfig(), self.durable)

async def mailbox(js, api, seat, prefix):
    name = "inbox-" + seat
    await api("CONSUMER.CREATE", {"durable_name": name})
    await js.add_consumer("AGENTS", ConsumerConfig(durable_name=f"inbox-{seat}"))
    await js.pull_subscribe("agents.inbox.x", "inbox-x")
    await js.subscribe("events.>", "q", None, prefix)
    both = groups.durable(groups.MAILBOX, seat=seat)
    if seat == "x":
        both = "inbox-x"
    await js.pull_subscribe_bind(consumer=both, stream="AGENTS")
    await js.add_consumer("AGENTS", durable_name=groups.other(seat))
""")
    assert sorted(expr for _, expr in found) == sorted(
        ["self.durable", "name", "f'inbox-{seat}'", "'inbox-x'", "prefix", "both", "groups.other(seat)"])


def test_rows_used_are_the_groups_of_durable_and_check_attach_calls():
    def used(source: str) -> set[str]:
        return rows_used(ast.parse(source))
    assert used("from crewlet import groups\nx = groups.durable(groups.CUSTODY)") == {"CUSTODY"}
    assert used("from crewlet.groups import MAILBOX as M, durable as d\nd(M, seat='x')") == {"MAILBOX"}
    assert used("import crewlet.groups\n"
                "crewlet.groups.check_attach(crewlet.groups.MAILBOX, roles)") == {"MAILBOX"}
    assert used("import crewlet.groups as g\ng.check_attach(roles=r, group=g.CUSTODY)") == {"CUSTODY"}
    # Imported or mentioned is not used.
    assert used("from crewlet.groups import MAILBOX, CUSTODY\nx = CUSTODY") == set()
    assert used("from crewlet import groups\ngroups.may_attach(groups.CUSTODY, r)") == set()
    assert used("from crewlet import groups\ngroups.durable(seat=groups.MAILBOX)") == set()
    # Not the table's durable, or not the table's row.
    assert used("from crewlet.groups import CUSTODY\nother.durable(CUSTODY)") == set()
    assert used("from crewlet import groups\nCUSTODY = 1\ngroups.durable(CUSTODY)") == set()


# ------------------------------------------------------------------ the functions

def test_durable_fills_in_the_name():
    assert groups.durable(MAILBOX, seat="cto") == "inbox-cto"
    assert groups.durable(CUSTODY) == "custody"
    for bad in ({}, {"node": "n1"}, {"seat": "a", "node": "b"}):
        with pytest.raises(ValueError, match="takes seat"):
            groups.durable(MAILBOX, **bad)
    with pytest.raises(ValueError, match="takes no parameters"):
        groups.durable(CUSTODY, seat="cto")
    for bad in ("", "a.b", "a b", "a*", "a>"):
        with pytest.raises(ValueError, match="bad seat"):
            groups.durable(MAILBOX, seat=bad)


def test_of_consumer():
    assert groups.of_consumer("AGENTS", "inbox-cto") is MAILBOX
    assert groups.of_consumer("AGENTS", groups.durable(MAILBOX, seat="a-b_c")) is MAILBOX
    assert groups.of_consumer("EVENTS", "custody") is CUSTODY
    assert groups.of_consumer("EVENTS", "inbox-cto") is None     # the right name on another stream
    assert groups.of_consumer("AGENTS", "custody") is None
    assert groups.of_consumer("AGENTS", "inbox-") is None
    assert groups.of_consumer("EVENTS", "custody-2") is None
    assert groups.of_consumer("ESTATE", "anything") is None      # the applier's ordered reader


def test_names_are_distinct_per_stream():
    assert len({(g.stream, g.name) for g in GROUPS}) == len(GROUPS)
    assert all(len(g.params) <= 1 for g in GROUPS)


@pytest.mark.parametrize("group, roles, allowed", [
    (MAILBOX, ["seats"], True),                  # a stateless agent host
    (MAILBOX, ["data", "seats", "workers"], True),
    (MAILBOX, ["data", "workers"], False),       # holds no seats
    (CUSTODY, ["data"], True),
    (CUSTODY, ["data", "ingress", "seats", "workers"], True),
    (CUSTODY, ["seats", "workers", "ingress"], False),  # a node that holds no data
    (CUSTODY, [], False),
])
def test_may_attach(group, roles, allowed):
    assert groups.may_attach(group, roles) is allowed
    if allowed:
        groups.check_attach(group, roles)
    else:
        with pytest.raises(GroupRefused) as refused:
            groups.check_attach(group, roles)
        message = str(refused.value)
        assert group.name in message and group.attach in message and group.why in message
        assert (", ".join(sorted(roles)) or "none") in message


def test_check_attach_says_why():
    with pytest.raises(GroupRefused, match=r"roles ingress, seats may not attach to consumer group custody "
                                           r"on EVENTS: it holds no estate copy; attaches: data nodes"):
        groups.check_attach(CUSTODY, ("seats", "ingress"))
    with pytest.raises(GroupRefused, match="it does not run the seats role"):
        groups.check_attach(MAILBOX, {"data"})
    assert CUSTODY.needs_estate and not MAILBOX.needs_estate
    assert (MAILBOX.stream, CUSTODY.stream) == ("AGENTS", "EVENTS")
