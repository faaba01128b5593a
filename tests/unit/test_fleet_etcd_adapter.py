"""EtcdCoordinator's logic without a server: names, endpoints, answers that are not
what etcd sends, values in the engine that are not ours.  The engine itself is
tested for real in tests/privileged/test_fleet_etcd.py."""

from __future__ import annotations

import base64
import json

import pytest
from etcd3gw import exceptions as gw_errors
from etcd3gw.client import Etcd3Client

from santhrottle.appliance.fleet.engine import EngineUnavailable, LeaseLost
from santhrottle.appliance.fleet.etcd import CALL_BUDGET_S, REQUEST_TIMEOUT_S, EtcdCoordinator
from santhrottle.appliance.fleet.gateway import Security
from santhrottle.appliance.fleet.names import check_name, parse_endpoint

pytestmark = pytest.mark.unit


def b64(s: str | bytes) -> str:
    return base64.b64encode(s.encode() if isinstance(s, str) else s).decode()


def test_endpoints_parse():
    assert parse_endpoint("10.0.0.1:2379") == ("http", "10.0.0.1", 2379)
    assert parse_endpoint("https://etcd1:2400") == ("https", "etcd1", 2400)
    assert parse_endpoint("[fd00::1]:2379") == ("http", "fd00::1", 2379)
    assert parse_endpoint("etcd1") == ("http", "etcd1", 2379)
    for bad in ("ftp://x:1", "://", ""):
        with pytest.raises(ValueError):
            parse_endpoint(bad)


@pytest.mark.parametrize("bad", ["", "a/b", "tab\there", None, 3])
def test_names_are_one_key_segment(bad):
    with pytest.raises(ValueError):
        check_name("resource", bad)


def test_construction_bounds():
    with pytest.raises(ValueError):
        EtcdCoordinator("arr", [])
    for ttl in (0, 1.5):
        with pytest.raises(ValueError):
            EtcdCoordinator("arr", ["127.0.0.1:1"], ttl_s=ttl)
    with pytest.raises(ValueError):
        EtcdCoordinator("a/b", ["127.0.0.1:1"])


def test_timeouts_scale_with_the_lease():
    one = EtcdCoordinator("arr", ["127.0.0.1:1"])
    assert (one.request_timeout_s, one.call_budget_s) == (REQUEST_TIMEOUT_S, CALL_BUDGET_S)
    three = EtcdCoordinator("arr", ["127.0.0.1:1"], ttl_s=3)
    assert three.request_timeout_s == pytest.approx(3 * REQUEST_TIMEOUT_S)
    assert three.call_budget_s == pytest.approx(3 * CALL_BUDGET_S)
    assert all(c.session.timeout_s == three.request_timeout_s for c in three.gateway.clients)
    given = EtcdCoordinator("arr", ["127.0.0.1:1"], ttl_s=3, request_timeout_s=0.2)
    assert (given.request_timeout_s, given.call_budget_s) == (0.2, 3 * CALL_BUDGET_S)


class Scripted:
    """Stands in for etcd3gw's post: answers (or raises) what the test says."""

    def __init__(self, *answers):
        self.answers = list(answers)
        self.urls: list[str] = []

    def __call__(self, client, url, *args, **kwargs):
        self.urls.append(url)
        got = self.answers.pop(0)
        if isinstance(got, Exception):
            raise got
        return got


@pytest.fixture
def scripted(monkeypatch):
    def make(*answers) -> tuple[EtcdCoordinator, Scripted]:
        s = Scripted(*answers)
        monkeypatch.setattr(Etcd3Client, "post", lambda client, url, *a, **k: s(client, url))
        return EtcdCoordinator("arr", ["h1:2379", "h2:2379"]), s

    return make


def kv(key: str, value: bytes | str, create: int = 5, lease: int = 0, mod: int = 0) -> dict:
    return {
        "key": b64(key),
        "value": b64(value),
        "create_revision": str(create),
        "mod_revision": str(mod or create),
        "lease": str(lease),
    }


def test_values_that_are_not_ours_are_skipped_and_counted(scripted):
    p = "/santhrottle/arr/"
    kvs = [
        kv(p + "appliances/a", json.dumps({"addr": "x"})),
        kv(p + "appliances/b", b"not json"),
        kv(p + "appliances/c", json.dumps([1, 2])),
        kv(p + "samples/a", json.dumps({"seq": 1})),
        kv(p + "leader/vg0", "a", create=9, lease=77),
        kv(
            p + "decisions/vg0",
            json.dumps({"epoch": 9, "appliance": "a", "payload": {"c": 1}}),
            create=10,
            lease=77,
        ),
        kv(p + "decisions/vg1", json.dumps({"epoch": "x", "appliance": "a", "payload": {}})),
        kv(p + "decisions/vg2", json.dumps({"epoch": 3, "appliance": "a", "payload": 7})),
        kv(p + "other/x", "{}"),
        kv(p + "appliances/d/e", "{}"),
        {"key": "%%%not base64"},
    ]
    c, _ = scripted({"header": {"revision": "12"}, "kvs": kvs})
    snap = c.snapshot()
    assert snap.revision == 12
    assert set(snap.appliances) == {"a"} and snap.samples == {"a": {"seq": 1}}
    assert snap.leaders["vg0"].epoch == 9 and snap.current("vg0").payload == {"c": 1}
    assert set(snap.decisions) == {"vg0"}
    assert c.bad_values == 7


def test_a_decision_is_current_only_under_the_leaders_lease_after_its_epoch(scripted):
    """What etcd says binds a decision to its leader, whatever the value says."""
    p = "/santhrottle/arr/"
    value = json.dumps({"epoch": 9, "appliance": "a", "payload": {"v": 1, "seq": 10**12}})
    cases = {  # the decision key's (lease, mod_revision) -> current?
        (77, 12): True,
        (0, 12): False,  # put by hand, without a lease
        (78, 12): False,  # another appliance's lease
        (77, 8): False,  # the same lease, before this leadership began (epoch 9)
        (77, 9): False,
    }
    for (lease, mod), current in cases.items():
        kvs = [kv(p + "leader/vg0", "a", create=9, lease=77),
               kv(p + "decisions/vg0", value, create=3, lease=lease, mod=mod)]  # fmt: skip
        c, _ = scripted({"header": {"revision": "20"}, "kvs": kvs})
        snap = c.snapshot()
        got = snap.decisions["vg0"]
        assert (got.lease, got.revision) == (lease, mod)
        assert (snap.current("vg0") is not None) == current, (lease, mod)


@pytest.mark.parametrize(
    "answer",
    [{}, {"header": {}}, {"header": {"revision": "x"}}, [], "text", None],
    ids=str,
)
def test_an_answer_of_the_wrong_shape_is_engine_unavailable(scripted, answer):
    c, _ = scripted(answer)
    with pytest.raises(EngineUnavailable) as e:
        c.snapshot()
    assert "unreadable answer" in str(e.value) and "h1:2379" in str(e.value)


def test_a_member_without_leader_sends_the_call_to_the_next(scripted):
    no_leader = gw_errors.ConnectionFailedError('{"error":"etcdserver: no leader"}')
    c, s = scripted(no_leader, {"header": {"revision": "3"}})
    assert c.snapshot().revision == 3
    assert [u.split("/")[2] for u in s.urls] == ["h1:2379", "h2:2379"]
    s.answers.append({"header": {"revision": "4"}})  # sticks with the one that answered
    c.snapshot()
    assert s.urls[-1].split("/")[2] == "h2:2379"


def test_lease_not_found_is_lease_lost(scripted):
    gone = gw_errors.Etcd3Exception('{"error":"etcdserver: requested lease not found"}')
    c, _ = scripted({"ID": "77", "TTL": "1"}, {"header": {"revision": "2"}}, gone)
    c.join("a", {})
    assert c.granted_ttl_s == 1
    with pytest.raises(LeaseLost):
        c.publish_samples({"seq": 1})
    with pytest.raises(LeaseLost):  # the lease is forgotten: join() again
        c.refresh()


def test_an_ended_lease_on_refresh_is_lease_lost(scripted):
    c, _ = scripted({"ID": "77", "TTL": "1"}, {"header": {"revision": "2"}}, {"result": {}})
    c.join("a", {})
    with pytest.raises(LeaseLost):
        c.refresh()


def test_no_server_is_engine_unavailable_naming_each_endpoint(scripted):
    """Both endpoints refuse (as etcd3gw reports a refused connection): one
    EngineUnavailable naming each; the real refusal, partition and lost quorum are
    tests/privileged/test_fleet_etcd.py's, in namespaces."""
    refused = gw_errors.ConnectionFailedError("[Errno 111] Connection refused")
    c, s = scripted(*[refused] * 8)
    with pytest.raises(EngineUnavailable) as e:
        c.snapshot()
    assert not isinstance(e.value, LeaseLost)
    for host in ("h1:2379", "h2:2379"):
        assert f"{host}: connection refused" in str(e.value)
    assert len(s.urls) >= 2
    with pytest.raises(LeaseLost):  # no lease yet: said before any request
        c.refresh()


def test_a_refused_request_is_engine_unavailable_at_once(scripted):
    bad = gw_errors.Etcd3Exception('{"error":"etcdserver: too many operations in txn"}')
    c, s = scripted(bad)
    with pytest.raises(EngineUnavailable) as e:
        c.snapshot()
    assert "unexpected answer" in str(e.value) and len(s.urls) == 1


@pytest.fixture
def with_user(monkeypatch):
    def make(*answers) -> tuple[EtcdCoordinator, Scripted]:
        s = Scripted(*answers)
        monkeypatch.setattr(Etcd3Client, "post", lambda client, url, *a, **k: s(client, url))
        sec = Security(user="gw-a", password="pw")
        return EtcdCoordinator("arr", ["h1:2379", "h2:2379"], security=sec), s

    return make


def err(text: str) -> gw_errors.Etcd3Exception:
    return gw_errors.Etcd3Exception(json.dumps({"error": f"etcdserver: {text}", "code": 7}))


def test_a_user_gets_a_token_that_every_endpoint_sends(with_user):
    c, s = with_user({"token": "tok.1"}, {"header": {"revision": "3"}})
    assert c.snapshot().revision == 3
    assert [u.split("/", 3)[3] for u in s.urls] == ["v3/auth/authenticate", "v3/kv/range"]
    assert all(cl.session.headers["Authorization"] == "tok.1" for cl in c.gateway.clients)


def test_a_token_etcd_no_longer_knows_is_asked_for_again_once(with_user):
    c, s = with_user(
        {"token": "tok.1"}, {"header": {"revision": "3"}},
        err("invalid auth token"), {"token": "tok.2"}, {"header": {"revision": "4"}},
    )  # fmt: skip
    c.snapshot()
    assert c.snapshot().revision == 4
    assert [u.rsplit("/", 1)[1] for u in s.urls] == [
        "authenticate", "range", "range", "authenticate", "range",
    ]  # fmt: skip
    assert c.gateway.clients[1].session.headers["Authorization"] == "tok.2"


@pytest.mark.parametrize(
    ("answers", "message"),
    [
        ([err("authentication failed, invalid user ID or password")],
         "etcd h1:2379: etcd refused user 'gw-a': etcdserver: authentication failed, invalid "
         "user ID or password"),
        ([{"token": "t"}, err("permission denied")], "etcd h1:2379: permission denied (user gw-a)"),
        ([{"token": "t"}, err("invalid auth token"), {"token": "t2"}, err("invalid auth token")],
         "etcd h1:2379: unexpected answer: etcdserver: invalid auth token"),
    ],
    ids=["bad password", "permission denied", "a token refused twice"],
)  # fmt: skip
def test_refused_credentials_are_engine_unavailable_naming_the_user(with_user, answers, message):
    c, s = with_user(*answers)
    with pytest.raises(EngineUnavailable) as e:
        c.snapshot()
    assert str(e.value) == message and not s.answers


def test_no_user_on_a_cluster_that_asks_for_one(scripted):
    c, _ = scripted(err("user name is empty"))
    with pytest.raises(EngineUnavailable, match=r"set fleet\.user and fleet\.password_file"):
        c.snapshot()


def test_tls_needs_https_endpoints():
    with pytest.raises(ValueError, match="every endpoint is https://"):
        EtcdCoordinator("arr", ["https://h1:2379", "h2:2379"], security=Security(ca="/ca.pem"))
    c = EtcdCoordinator("arr", ["https://h1:2379"], security=Security(ca="/ca.pem"))
    assert c.gateway.clients[0].get_url("/kv/range") == "https://h1:2379/v3/kv/range"
