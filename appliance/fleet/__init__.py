"""The fleet's coordination: the appliances of one array agree through an engine (etcd).

    engine.py  the interface: Coordinator, EngineUnavailable, what it returns
    etcd.py    EtcdCoordinator, the interface over etcd's v3 API (etcd3gw)
    codec.py   the controller's Samples to and from JSON-able dicts

docs/fleet.md: why etcd, its measured costs, the keys and the failure modes.
"""
