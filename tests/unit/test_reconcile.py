"""The reconcile duty's reading of GitHub's answers (roles/workers/duties/reconcile.py)
and its company keys."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from crewlet.company.model import Integration
from roles.workers.duties.reconcile import _next_link, missed


def _d(id: int, guid: str, status: int, at: str = "2026-12-06T08:00:00Z") -> dict:
    return {"id": id, "guid": guid, "status_code": status, "delivered_at": at}


def test_a_guid_is_missed_only_while_no_attempt_of_it_got_a_2xx():
    found = [_d(1, "a", 502), _d(2, "a", 0, "2026-12-06T08:01:00Z"),   # failed twice: the newest asked
             _d(3, "b", 502), _d(4, "b", 200, "2026-12-06T08:02:00Z"),  # redelivered already
             _d(5, "c", 202),                                           # unrouted: answered all the same
             _d(6, "d", 0), {"id": "x", "guid": "e", "status_code": 500},  # a malformed row is passed over
             _d(7, "f", True), {"id": 8, "guid": "g", "status_code": "200"}]  # not numbers: not a 2xx
    assert {g: d["id"] for g, d in missed(found).items()} == {"a": 2, "d": 6, "f": 7, "g": 8}


def test_the_next_page_is_read_from_the_link_header():
    link = ('<https://api.github.com/repos/a/b/hooks/1/deliveries?per_page=100&cursor=v1_7>; rel="next", '
            '<https://api.github.com/repos/a/b/hooks/1/deliveries?per_page=100>; rel="first"')
    assert _next_link(link) == "https://api.github.com/repos/a/b/hooks/1/deliveries?per_page=100&cursor=v1_7"
    assert _next_link(None) is None and _next_link('<x>; rel="prev"') is None


@pytest.mark.parametrize("integration, where, says", [
    ({"kind": "slack", "reconcile": {"repository": "a/b", "hook_id": 1, "token_env": "T"}}, "reconcile",
     "only for kind github"),
    ({"kind": "github", "reconcile": {"repository": "a/b", "hook_id": 1}}, "reconcile.token_env",
     "exactly one"),
    ({"kind": "github", "reconcile": {"repository": "a/b", "hook_id": 1, "token_env": "T",
                                      "token_secret": "gh"}}, "reconcile.token_env", "exactly one"),
    ({"kind": "github", "reconcile": {"repository": "not a repo", "hook_id": 1, "token_env": "T"}},
     "reconcile.repository", "owner/name"),
    ({"kind": "github", "reconcile": {"repository": "a/b", "hook_id": 0, "token_env": "T"}},
     "reconcile.hook_id", "greater than or equal to 1"),
])
def test_reconcile_keys_are_checked(integration, where, says):
    with pytest.raises(ValidationError) as info:
        Integration(secret_env="S", routes=[{"seat": "w"}], **integration)
    err = info.value.errors()[0]
    assert ".".join(map(str, err["loc"])) == where and says in err["msg"], err
