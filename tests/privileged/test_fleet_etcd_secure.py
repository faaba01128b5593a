"""EtcdCoordinator on a 3-member etcd cluster with TLS and authentication on, each
member in a network namespace this test makes (tests/privileged/etcd_cluster.py,
cluster(secure=True)): certificates made by the test with openssl, clients asked for
a certificate, and etcd users with the least rights docs/fleet.md ("Security") gives
an appliance, as etcd's RBAC roles on key prefixes.

What it shows: the whole behaviour suite over TLS with a user; an appliance's
least-rights user can do its job, and a follower's user cannot write a decision;
nobody can put a key under another appliance's lease or revoke it (but may keep
it alive: etcd 3.4 does not check who refreshes a lease); a bad password, no user, no
client certificate and the wrong CA each fail with one line saying so; a token etcd
has forgotten is asked for again.  Skips, with the reason, without root, etcd,
etcdctl or openssl.
"""

from __future__ import annotations

import itertools
import json
import os
import time

import pytest

from santhrottle.appliance.fleet.engine import EngineUnavailable
from tests.privileged.etcd_cluster import (
    TOKEN_TTL_S,
    Agent,
    Credentials,
    Forger,
    appliance_grants,
    cluster,
    missing,
)
from tests.unit.fleet_contract import CHECKS, FORGERY_CHECKS

pytestmark = pytest.mark.privileged
_n = itertools.count()
ARRAY = "arr"
P = f"/santhrottle/{ARRAY}/"


@pytest.fixture(scope="module")
def secure():
    why = missing(secure=True)
    if why:
        pytest.skip(why)
    with cluster(f"{os.getpid()}s", secure=True) as c:
        c.enable_auth()
        c.users = {
            "gw-a": c.add_user("gw-a", appliance_grants(ARRAY, "gw-a", lead=True)),
            "gw-b": c.add_user("gw-b", appliance_grants(ARRAY, "gw-b", lead=True)),
            "gw-f": c.add_user("gw-f", appliance_grants(ARRAY, "gw-f", lead=False)),
            "fleet": c.add_user("fleet", [("readwrite", "/santhrottle/", True)]),
        }
        yield c


@pytest.fixture
def agents(secure):
    made: list[Agent] = []

    def make(member: int, array: str, creds: Credentials | None = None) -> Agent:
        made.append(Agent(secure, member, array, creds=creds))
        return made[-1]

    yield make
    for a in made:
        a.kill()


@pytest.mark.parametrize("check", CHECKS + FORGERY_CHECKS, ids=lambda f: f.__name__)
def test_the_behaviour_suite_over_tls_with_a_user(secure, agents, check):
    array, members = f"tls{next(_n)}", itertools.cycle(range(3))
    creds = secure.users["fleet"]
    new = lambda: agents(next(members), array, creds)  # noqa: E731
    check(new, Forger(secure, array)) if check in FORGERY_CHECKS else check(new)


def test_least_rights_users_lead_and_follow_and_a_follower_cannot_write_a_decision(secure, agents):
    a = agents(0, ARRAY, secure.users["gw-a"])
    f = agents(1, ARRAY, secure.users["gw-f"])
    a.join("gw-a", {})
    f.join("gw-f", {})
    lead = a.campaign("vg0")
    assert lead is not None and a.publish_decisions("vg0", lead.epoch, {"seq": 1})
    a.publish_samples({"seq": 1})
    f.publish_samples({"seq": 2})
    snap = f.snapshot()
    assert set(snap.appliances) == {"gw-a", "gw-f"} and set(snap.samples) == {"gw-a", "gw-f"}
    got = snap.current("vg0")
    assert got is not None and dict(got.payload) == {"seq": 1}
    # the follower's user: no write on leaders or decisions, through the adapter ...
    for call in (lambda: f.campaign("vg1"), lambda: f.publish_decisions("vg0", lead.epoch, {})):
        with pytest.raises(EngineUnavailable) as e:
            call()
        print(f"\nfollower's user: {e.value}")
        assert "permission denied (user gw-f)" in str(e.value)
    # ... and by hand, with etcdctl and its own certificate and password
    forged = json.dumps({"epoch": lead.epoch, "appliance": "gw-a", "payload": {"seq": 10**12}})
    for key in (f"{P}decisions/vg0", f"{P}leader/vg9", f"{P}appliances/gw-a", f"{P}samples/gw-a"):
        with pytest.raises(AssertionError, match="permission denied"):
            secure.etcdctl(2, "put", key, forged, user="gw-f")
    got = f.snapshot().current("vg0")
    assert got is not None and dict(got.payload) == {"seq": 1}
    f.leave()  # its own lease, its own keys: revoking it is allowed
    assert set(a.snapshot().appliances) == {"gw-a"}


def test_no_user_can_put_a_key_under_another_appliances_lease(secure, agents):
    """etcd refuses to attach a lease to a key for a user that may not write every
    key already under that lease: so another appliance's user, though it may write
    decisions, cannot forge one under the leader's lease."""
    a = agents(0, ARRAY, secure.users["gw-a"])
    a.join("gw-a", {})
    lead = a.campaign("vg2")
    assert lead is not None and a.publish_decisions("vg2", lead.epoch, {"seq": 1})
    lease = f"--lease={a.lease:x}"
    forged = json.dumps({"epoch": lead.epoch, "appliance": "gw-a", "payload": {"seq": 10**12}})
    with pytest.raises(AssertionError, match="permission denied"):
        secure.etcdctl(2, "put", lease, f"{P}decisions/vg2", forged, user="gw-b")
    secure.etcdctl(2, "put", f"{P}decisions/vg2", forged, user="gw-b")  # without: allowed ...
    assert a.snapshot().current("vg2") is None  # ... and never current
    with pytest.raises(AssertionError, match="permission denied"):  # nor may it end a's lease
        secure.etcdctl(2, "lease", "revoke", f"{a.lease:x}", user="gw-b")
    # but etcd 3.4 lets any user keep any lease alive (docs/fleet.md, "Security")
    kept = secure.etcdctl(2, "lease", "keep-alive", "--once", f"{a.lease:x}", user="gw-b")
    print(f"\ngw-b on gw-a's lease: {kept.strip()}")
    assert "keepalived" in kept
    a.resign("vg2")


@pytest.mark.parametrize(
    ("what", "expect"),
    [
        ("bad password", "etcd refused user 'gw-a': etcdserver: authentication failed"),
        ("no user", "etcd asks for a user (user name is empty)"),
        ("no client certificate", "the member refused the TLS handshake: no client certificate"),
        ("another CA", "the member's certificate is not signed by fleet.ca"),
    ],
)
def test_credentials_that_do_not_serve_fail_with_one_line(secure, agents, tmp_path, what, expect):
    good = secure.users["gw-a"]
    creds = {
        "bad password": Credentials(good.ca, good.cert, good.key, "gw-a", str(tmp_path / "pw")),
        "no user": Credentials(good.ca, good.cert, good.key),
        "no client certificate": Credentials(good.ca, None, None, "gw-a", good.password_file),
        "another CA": Credentials("/etc/ssl/certs/ca-certificates.crt", good.cert, good.key,
                                  "gw-a", good.password_file),
    }[what]  # fmt: skip
    (tmp_path / "pw").write_text("wrong\n")
    if what == "another CA" and not os.path.exists(str(creds.ca)):
        pytest.skip("no system CA bundle")
    x = agents(0, ARRAY, creds)
    with pytest.raises(EngineUnavailable) as e:
        x.snapshot()
    print(f"\n{what}: {e.value}")
    assert expect in str(e.value) and "\n" not in str(e.value)


def test_a_token_etcd_has_forgotten_is_asked_for_again(secure, agents):
    x = agents(1, ARRAY, secure.users["gw-b"])
    x.snapshot()
    assert x.call("authentications") == 1
    time.sleep(TOKEN_TTL_S + 1.5)  # unused for longer than --auth-token-ttl: etcd drops it
    x.snapshot()
    assert x.call("authentications") == 2
