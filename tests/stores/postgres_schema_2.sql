CREATE SEQUENCE IF NOT EXISTS celery_leader_token_seq;
CREATE TABLE IF NOT EXISTS celery_leader_lease (
    name text PRIMARY KEY,
    lease_id text,
    nodename text,
    hostname text,
    pid integer,
    token bigint,
    acquired_at double precision,
    expires_at_us bigint NOT NULL DEFAULT 0,
    hold_until_us bigint NOT NULL DEFAULT 0,
    ttl_us bigint NOT NULL DEFAULT 0,
    lease_end_us bigint NOT NULL DEFAULT 0,
    incarnation text
);
CREATE TABLE IF NOT EXISTS celery_leader_state (
    name text NOT NULL,
    key text NOT NULL,
    value text NOT NULL,
    PRIMARY KEY (name, key)
);
CREATE OR REPLACE FUNCTION celery_leader_now_us() RETURNS bigint LANGUAGE sql VOLATILE
    AS $$ SELECT (extract(epoch FROM clock_timestamp()) * 1000000)::bigint $$;
-- The data's incarnation: the cluster's identity, its timeline and the server's start.
CREATE OR REPLACE FUNCTION celery_leader_incarnation() RETURNS text LANGUAGE sql VOLATILE
    AS $$ SELECT (SELECT system_identifier::text FROM pg_control_system()) || ':'
                 || substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8) || ':'
                 || pg_postmaster_start_time()::text $$;
CREATE TABLE IF NOT EXISTS celery_leader_member (
    grp text NOT NULL,
    member text NOT NULL,
    payload text NOT NULL,
    expires_at_us bigint NOT NULL,
    PRIMARY KEY (grp, member)
);
-- The acquire, in one statement (celery_leader/stores/rules.py, in SQL). Dropped first:
-- an earlier version's has fewer OUT columns, which CREATE OR REPLACE cannot change.
DROP FUNCTION IF EXISTS celery_leader_acquire(text, text, text, text, integer, bigint, bigint);
CREATE FUNCTION celery_leader_acquire(
    p_name text, p_lease_id text, p_nodename text, p_hostname text, p_pid integer,
    p_ttl_us bigint, p_min_token bigint,
    OUT o_acquired boolean, OUT o_token bigint, OUT o_hold_off_us bigint,
    OUT o_lease_id text, OUT o_nodename text, OUT o_hostname text, OUT o_pid integer,
    OUT o_held_token bigint, OUT o_acquired_at double precision, OUT o_expires_at_us bigint,
    OUT o_hold_until_us bigint, OUT o_ttl_us bigint, OUT o_now_us bigint,
    OUT o_restarted_us bigint)
LANGUAGE plpgsql VOLATILE AS $$
DECLARE
    r record;
    seen text;
    live boolean;
    own_hold_until bigint := 0;
    forgot boolean;
    hold_until bigint;
    drawn bigint;
BEGIN
    INSERT INTO celery_leader_lease (name) VALUES (p_name) ON CONFLICT DO NOTHING;
    SELECT * INTO STRICT r FROM celery_leader_lease WHERE name = p_name FOR UPDATE;
    o_now_us := celery_leader_now_us();
    seen := celery_leader_incarnation();
    live := r.lease_id IS NOT NULL AND r.expires_at_us > o_now_us;
    IF live AND r.lease_id <> p_lease_id THEN
        o_acquired := false;
        o_lease_id := r.lease_id; o_nodename := r.nodename; o_hostname := r.hostname;
        o_pid := r.pid; o_held_token := r.token; o_acquired_at := r.acquired_at;
        o_expires_at_us := r.expires_at_us; o_hold_until_us := r.hold_until_us;
        o_ttl_us := r.ttl_us;
        RETURN;
    END IF;
    IF live THEN
        own_hold_until := r.hold_until_us;  -- our own lease (a lost reply): its hold-off runs on
    END IF;
    -- rules.store_forgot: no record (first use, or a database without its row), data of
    -- another cluster or timeline (the incarnation's part before its second colon), or a
    -- lease gone before its recorded end (rules.lease_vanished_early).
    forgot := r.incarnation IS NULL
        OR substring(r.incarnation FROM '^[^:]*:[^:]*') <> substring(seen FROM '^[^:]*:[^:]*')
        OR (NOT live AND r.lease_end_us > o_now_us);
    -- Only the start time differs: the server restarted (rules.hold_off's restarted_at).
    IF NOT forgot AND r.incarnation <> seen THEN
        o_restarted_us := (extract(epoch FROM pg_postmaster_start_time()) * 1000000)::bigint;
    END IF;
    -- rules.hold_off
    o_hold_off_us := GREATEST(0, own_hold_until - o_now_us);
    hold_until := own_hold_until;
    IF forgot THEN
        hold_until := GREATEST(hold_until, o_now_us + p_ttl_us);
        o_hold_off_us := GREATEST(o_hold_off_us, p_ttl_us);
    ELSIF o_restarted_us IS NOT NULL THEN
        hold_until := GREATEST(hold_until, o_restarted_us + p_ttl_us);
        o_hold_off_us := GREATEST(o_hold_off_us, o_restarted_us + p_ttl_us - o_now_us);
    END IF;
    -- rules.next_token, the sequence's last value being drawn - 1
    drawn := nextval('celery_leader_token_seq');
    o_token := GREATEST(drawn, o_now_us, p_min_token + 1);
    IF o_token <> drawn THEN
        PERFORM setval('celery_leader_token_seq', o_token);
    END IF;
    UPDATE celery_leader_lease SET lease_id = p_lease_id, nodename = p_nodename,
        hostname = p_hostname, pid = p_pid, token = o_token, acquired_at = o_now_us / 1e6,
        expires_at_us = o_now_us + p_ttl_us, hold_until_us = hold_until, ttl_us = p_ttl_us,
        lease_end_us = o_now_us + p_ttl_us, incarnation = seen
        WHERE name = p_name;
    o_acquired := true;
END $$;
COMMENT ON FUNCTION celery_leader_acquire(text, text, text, text, integer, bigint, bigint)
    IS 'celery-leader schema 2';
