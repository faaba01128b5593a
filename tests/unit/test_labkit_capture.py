"""labkit.capture.order: the order the target's packets left its veth, from tcpdump's
lines (the format of tcpdump 4.99 -tt -nn -v -S -r, Debian 12's, as the lab guest runs it;
the first two packets are copied from a capture of a scratch netns pair)."""

from labkit import capture

SYNACK = (
    "1795889742.399349 IP (tos 0x0, ttl 64, id 0, offset 0, flags [DF], proto TCP (6), "
    "length 60)\n"
    "    10.0.0.14.3260 > 10.0.0.5.52078: Flags [S.], cksum 0x14db (incorrect -> 0xbd0d), "
    "seq 1791514679, ack 1346880637, win 65160, options [mss 1460,sackOK,TS val 1803875630 "
    "ecr 2940123080,nop,wscale 10], length 0"
)


def _pkt(t: float, ident: int, seq: int | None, n: int = 48, dst: str = "10.0.0.5") -> str:
    data = f"seq {seq}:{seq + n}, " if seq is not None else ""
    return (
        f"{t:.6f} IP (tos 0x0, ttl 64, id {ident}, offset 0, flags [DF], proto TCP (6), "
        f"length {52 + (n if seq is not None else 0)})\n"
        f"    10.0.0.14.3260 > {dst}.52078: Flags [{'P.' if seq is not None else '.'}], "
        f"cksum 0x1503 (incorrect -> 0x9ea2), {data}ack 1346880637, win 64, "
        f"options [nop,nop,TS val 1803875630 ecr 2940123080], length {n if seq else 0}"
    )


def _lines(*pkts: str) -> list[str]:
    return "\n".join(pkts).splitlines()


def test_packets_in_the_order_sent_are_neither_overtaken_nor_sent_twice():
    got = capture.order(
        _lines(
            SYNACK,
            _pkt(1.0, 565, 1000),
            _pkt(1.1, 566, None),
            _pkt(1.2, 567, 1048),
            _pkt(1.3, 568, 1096),
        )
    )
    assert got == {"10.0.0.5": {"packets": 5, "overtaken": 0, "sent_twice": 0, "events": []}}


def test_a_packet_that_left_after_a_later_one_and_its_retransmission():
    """The qdisc let ID 11 (bytes 1048-1096) leave after ID 12 (1096-1144): overtaken;
    the target then sent 1048-1096 again (ID 13): sent twice, in order."""
    got = capture.order(
        _lines(_pkt(1.0, 10, 1000), _pkt(1.1, 12, 1096), _pkt(1.2, 11, 1048), _pkt(1.3, 13, 1048))
    )
    ip = got["10.0.0.5"]
    assert (ip["packets"], ip["overtaken"], ip["sent_twice"]) == (4, 1, 1)
    over, twice = ip["events"]
    assert (over["what"], over["t"], over["id"], over["behind"]) == ("overtaken", 1.2, 11, 1)
    assert (twice["what"], twice["id"], twice["seq"]) == ("sent twice", 13, "1048")


def test_a_syn_acks_id_is_not_the_connections():
    """The SYN-ACK goes out with ID 0 (a request, not yet the socket); the socket's own
    IDs start anywhere, here 63682: nothing is overtaken."""
    got = capture.order(_lines(SYNACK, _pkt(1.0, 63682, 1000), _pkt(1.1, 63683, 1048)))
    assert got["10.0.0.5"]["overtaken"] == 0


def test_ids_wrap_and_connections_and_writers_count_apart():
    got = capture.order(
        _lines(
            _pkt(1.0, 65534, 1000),
            _pkt(1.1, 65535, 1048),
            _pkt(1.2, 0, 1096),
            _pkt(1.3, 1, 1144),
            _pkt(1.4, 7, 5000, dst="10.0.0.3"),  # another writer: its own counter
            _pkt(1.5, 3, 6000, dst="10.0.0.3"),
        )
    )
    assert got["10.0.0.5"]["overtaken"] == 0 and got["10.0.0.5"]["packets"] == 4
    assert got["10.0.0.3"]["overtaken"] == 1 and got["10.0.0.3"]["events"][0]["behind"] == 4


def _ack(t: float, ack: int, sack: str = "", src: str = "10.0.0.5", ident: int = 900) -> str:
    """A writer's pure ACK to the target's port (tcpdump -S prints SACK blocks absolute)."""
    opts = "nop,nop,TS val 99 ecr 5000" + (f",nop,nop,sack 1 {sack}" if sack else "")
    return (
        f"{t:.6f} IP (tos 0x0, ttl 64, id {ident}, offset 0, flags [DF], proto TCP (6), "
        f"length 52)\n"
        f"    {src}.52078 > 10.0.0.14.3260: Flags [.], cksum 0x1503 (incorrect -> 0x9ea2), "
        f"ack {ack}, win 64, options [{opts}], length 0"
    )


def _ts(pkt: str, ts: int) -> str:
    return pkt.replace("TS val 1803875630", f"TS val {ts}")


def test_a_spurious_probe_says_how_late_the_writers_ack_came_and_what_the_timer_took():
    """The target's last segment (1048-1096) leaves the qdisc at 1.0 s; its TCP sends it
    again 190 ms after the original (TS clock) and the copy leaves at 1.3 s; the writer's
    ACK of the original reached the target at 1.25 s, 250 ms after the original left,
    and its D-SACK of the copy at 1.35 s.  The writer's packets are not the target's."""
    got = capture.order(
        _lines(
            _ts(_pkt(0.9, 10, 1000), 4900),
            _ack(0.95, 1048),
            _ts(_pkt(1.0, 11, 1048), 5000),
            _ack(1.25, 1096),
            _ts(_pkt(1.3, 12, 1048), 5190),
            _ack(1.35, 1096, sack="{1048:1096}"),
        ),
        port=3260,
    )
    ip = got["10.0.0.5"]
    assert (ip["packets"], ip["overtaken"], ip["sent_twice"]) == (3, 0, 1)
    (e,) = ip["events"]
    assert (e["what"], e["t"], e["seq"]) == ("sent twice", 1.3, "1048")
    assert (e["orig_ms"], e["ts_gap_ms"], e["ack_ms"], e["dsack"]) == (300.0, 190, 250.0, True)


def test_an_ack_after_the_copy_is_filled_in_and_a_lost_original_has_no_dsack():
    got = capture.order(
        _lines(
            _ts(_pkt(1.0, 11, 1048), 5000),
            _ts(_pkt(1.2, 12, 1048), 5200),
            _ack(1.4, 1096),  # covers both: no D-SACK, the copy was needed
            _ack(1.5, 1096, sack="{1000:1048}"),  # a D-SACK of other bytes
        ),
        port=3260,
    )
    (e,) = got["10.0.0.5"]["events"]
    assert (e["orig_ms"], e["ts_gap_ms"], e["ack_ms"], e["dsack"]) == (200.0, 200, 400.0, False)


def test_without_the_port_every_packet_counts_as_the_targets_as_before():
    """A capture of the target's direction only (the runs before the ACKs were captured)
    reads as it did; the timing of a copy has no ACK."""
    got = capture.order(_lines(_pkt(1.0, 11, 1048), _pkt(1.2, 12, 1048)))
    (e,) = got["10.0.0.5"]["events"]
    assert (e["orig_ms"], e["ack_ms"], e["dsack"]) == (200.0, None, False)


def test_the_report_says_a_copys_timing_and_nothing_for_an_overtaken_packet():
    e = {"orig_ms": 300.0, "ts_gap_ms": 190, "ack_ms": 250.0, "dsack": True}
    assert capture.timing(e) == (
        "; the original left 300 ms before, 190 ms after it in the target's TCP; "
        "its ACK 250 ms after it left, D-SACKed (spurious)"
    )
    assert "no ACK of it captured" in capture.timing({**e, "ack_ms": None, "dsack": False})
    assert capture.timing({"what": "overtaken", "behind": 1}) == ""
