"""pg_stat_activity of real PostgreSQL connections in known states, as `latprof attach --db` samples them."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
import threading
import time
import uuid

import psutil
import pytest

from attach.procs import free_port
import services  # tests/services.py: the local services the tests use
from latprof.collectors.attach.pg_activity import APPLICATION_NAME, Backend, PgActivity, PgActivityError


def local_port(conn) -> int:
    """The client port of a psycopg connection, from its socket (a query would change its state)."""
    with socket.socket(fileno=os.dup(conn.pgconn.socket)) as s:
        return int(s.getsockname()[1])


def own_server_ports(server_port: int) -> set[int]:
    """Local ports of this process's TCP connections to the server's port."""
    return {c.laddr.port for c in psutil.Process().net_connections(kind="tcp") if c.raddr and c.raddr.port == server_port}


def one_line(exc: BaseException) -> str:
    text = str(exc)
    assert text and "\n" not in text and "Traceback" not in text, text
    return text


@pytest.fixture
def dsn() -> str:
    services.require_pg()
    return services.PG_DSN


@pytest.fixture
def sampler(dsn):
    """An open sampler and the client port of its own connection."""
    act = PgActivity(dsn)
    port = act.server()[1]
    before = own_server_ports(port)
    act.open()
    try:
        (own,) = own_server_ports(port) - before
        yield act, own
    finally:
        act.close()


@pytest.fixture
def conns(dsn):
    """`connect(**kwargs)`: psycopg connections to the test database, all closed at the end."""
    import psycopg

    with contextlib.ExitStack() as stack:

        def connect(**kwargs):
            return stack.enter_context(psycopg.connect(dsn, **kwargs))

        yield connect


def test_sample_gives_the_asked_backends_in_their_states(sampler, conns):
    import psycopg

    act, own_port = sampler
    idle = conns(autocommit=True)
    idle.execute("SELECT 1")
    in_tx = conns()  # psycopg opens the transaction with the first statement
    in_tx.execute("SELECT 1")
    began_idle_in_tx = time.monotonic()
    aborted = conns()
    with pytest.raises(psycopg.errors.DivisionByZero):
        aborted.execute("SELECT 1 / 0")
    active = conns(autocommit=True)
    bystander = conns(autocommit=True)
    bystander.execute("SELECT 1")
    ports = {name: local_port(c) for name, c in [("idle", idle), ("in_tx", in_tx), ("aborted", aborted), ("active", active)]}

    sleeper = threading.Thread(target=active.execute, args=("SELECT pg_sleep(1)",))
    sleeper.start()
    try:
        time.sleep(0.3)
        deadline = time.monotonic() + 2
        while True:  # the thread's statement reaches the server soon, not at once
            before_sample = time.monotonic()
            found = {b.client_port: b for b in act.sample({*ports.values(), own_port})}
            if found.get(ports["active"], None) and found[ports["active"]].state == "active":
                break
            assert time.monotonic() < deadline, found
            time.sleep(0.02)
    finally:
        sleeper.join()

    assert set(found) == set(ports.values())  # no bystander, not the sampler's own connection
    assert all(isinstance(b, Backend) and b.client_addr == "127.0.0.1" and b.pid > 0 for b in found.values())
    assert len({b.pid for b in found.values()}) == 4
    assert not act.restricted

    b = found[ports["idle"]]
    assert (b.state, b.wait_event_type, b.wait_event, b.xact_age_ms) == ("idle", "Client", "ClientRead", None)
    assert b.state_age_ms is not None and b.query_age_ms is not None and b.query_age_ms >= b.state_age_ms >= 0

    b = found[ports["in_tx"]]
    slept_ms = (before_sample - began_idle_in_tx) * 1000
    assert b.state == "idle in transaction"
    assert b.state_age_ms is not None and slept_ms - 5 <= b.state_age_ms < slept_ms + 2000
    assert b.xact_age_ms is not None and b.query_age_ms is not None
    assert b.xact_age_ms >= b.state_age_ms and b.query_age_ms >= b.state_age_ms

    b = found[ports["aborted"]]
    assert b.state == "idle in transaction (aborted)"
    assert b.xact_age_ms is None and b.state_age_ms is not None  # the server clears an aborted one's xact_start

    b = found[ports["active"]]
    assert (b.state, b.wait_event_type, b.wait_event) == ("active", "Timeout", "PgSleep")
    assert b.query_age_ms is not None and 0 <= b.query_age_ms < 1000
    assert b.xact_age_ms is not None and b.xact_age_ms >= b.query_age_ms - 1


def test_sample_of_ports_with_no_backend_is_empty(sampler, conns):
    act, own_port = sampler
    conns(autocommit=True).execute("SELECT 1")  # a backend that is not asked for
    assert act.sample(set()) == []
    assert act.sample({own_port}) == []  # its own connection never shows
    assert act.sample({free_port()}) == []
    assert not act.restricted


def test_client_addrs_narrow_by_the_address_the_server_sees(sampler, conns):
    act, _ = sampler
    port = local_port(conns(autocommit=True))
    assert [b.client_port for b in act.sample({port}, client_addrs={"::ffff:127.0.0.1"})] == [port]
    assert act.sample({port}, client_addrs={"10.1.2.3"}) == []


def test_server_is_the_remote_address_the_clients_sockets_show(sampler, conns):
    act, _ = sampler
    conn = conns(autocommit=True)
    (remote,) = [c.raddr for c in psutil.Process().net_connections(kind="tcp") if c.laddr.port == local_port(conn)]
    assert act.server() == (remote.ip, remote.port)
    # Before connecting: the DSN's host, resolved ('localhost' to a loopback address).
    assert PgActivity("postgresql://u@localhost:6543/db").server() in {("127.0.0.1", 6543), ("::1", 6543)}
    assert PgActivity("host=127.0.0.1 dbname=db").server() == ("127.0.0.1", 5432)


def test_the_sampler_connection_is_named(sampler, conns):
    act, own_port = sampler
    row = conns(autocommit=True).execute(
        "SELECT application_name, state FROM pg_stat_activity WHERE client_port = %s", (own_port,)
    ).fetchone()
    assert row == (APPLICATION_NAME, "idle")


def test_a_lost_connection_is_one_error_and_open_reconnects(sampler, conns):
    act, own_port = sampler
    killer = conns(autocommit=True)
    killer.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE client_port = %s", (own_port,))
    port = local_port(killer)
    with pytest.raises(PgActivityError) as err:
        act.sample({port})
    assert "lost the connection to PostgreSQL at 127.0.0.1:" in one_line(err.value)
    act.open()
    assert [b.client_port for b in act.sample({port})] == [port]


def test_sample_before_open_is_an_error():
    with pytest.raises(PgActivityError, match="not connected"):
        PgActivity("host=127.0.0.1").sample({1})


@pytest.fixture
def unprivileged_dsn(dsn, conns):
    """A DSN for a fresh login role without pg_read_all_stats (dropped at the end)."""
    import psycopg
    from psycopg.conninfo import conninfo_to_dict, make_conninfo

    role, password = f"latprof_test_{uuid.uuid4().hex[:12]}", uuid.uuid4().hex
    admin = conns(autocommit=True)
    try:
        admin.execute(f'CREATE ROLE "{role}" LOGIN PASSWORD \'{password}\'')
    except psycopg.errors.InsufficientPrivilege as exc:
        services.missing(f"the test DSN's user cannot CREATE ROLE: {exc}", "a PostgreSQL user with CREATEROLE is")
    try:
        yield make_conninfo(**{**conninfo_to_dict(dsn), "user": role, "password": password})
    finally:
        admin.execute(f'DROP ROLE "{role}"')


def test_other_users_backends_are_hidden_without_pg_read_all_stats(unprivileged_dsn, conns):
    import psycopg

    other_user = local_port(conns(autocommit=True))
    with contextlib.closing(psycopg.connect(unprivileged_dsn, autocommit=True)) as same_user_conn:
        same_user = local_port(same_user_conn)
        act = PgActivity(unprivileged_dsn)
        act.open()
        try:
            (b,) = act.sample({same_user})  # its own user's backends need no privilege
            assert b.state == "idle" and not act.restricted
            assert act.sample({other_user}) == []  # hidden: not even its client port shows
            assert act.restricted
        finally:
            act.close()


def test_a_closed_port_is_one_line_naming_host_and_port():
    port = free_port()
    act = PgActivity(f"postgresql://postgres@127.0.0.1:{port}/test", connect_timeout_s=2)
    with pytest.raises(PgActivityError) as err:
        act.open()
    assert one_line(err.value) == f"cannot connect to PostgreSQL at 127.0.0.1:{port}: Connection refused"
    act.close()


@pytest.mark.parametrize("bad", ["not a dsn", "postgresql://u:s3cr%zzet@127.0.0.1/db", "host=127.0.0.1 port=abc"])
def test_a_bad_dsn_is_one_line_without_its_secrets(bad):
    with pytest.raises(PgActivityError) as err:
        PgActivity(bad).open()
    text = one_line(err.value)
    assert text.startswith("--db is not a valid PostgreSQL DSN: ") and "s3cr" not in text


@pytest.mark.parametrize("dsn", ["host=/var/run/postgresql dbname=test", "dbname=test", "postgresql:///test?host=/tmp"])
def test_a_unix_socket_dsn_is_refused(dsn, monkeypatch):
    for name in ("PGHOST", "PGHOSTADDR"):
        monkeypatch.delenv(name, raising=False)
    with pytest.raises(PgActivityError) as err:
        PgActivity(dsn).open()
    assert "unix socket" in one_line(err.value)


def test_without_psycopg_the_error_says_how_to_install_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "psycopg", None)  # `import psycopg` raises ImportError
    with pytest.raises(PgActivityError) as err:
        PgActivity("host=127.0.0.1").open()
    assert one_line(err.value) == "--db needs psycopg: pip install 'psycopg[binary]'"


def test_importing_the_collector_does_not_import_psycopg():
    code = "import sys; import latprof.collectors.attach.pg_activity; assert 'psycopg' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)
