-- The executions table's batch on PostgreSQL, one call (see supervisor/ledger/postgres/executions.py):
-- the acknowledgements, the waiters of the executions they ended, and a claim. Each session makes
-- it for itself, in its own temporary schema, when it connects.
--
-- Read by `executions.batch_function()`, which fills in the names in braces from the Python
-- constants that are theirs (str.format): columns, the executions table's columns
-- (`tables.execution_rows.COLUMNS`); acknowledged and superseded, how a delivery ended
-- (`values.DeliveryEnd`); ended_channel and max_payload, the notification of ended executions
-- (`notify`); terminal, the terminal statuses as SQL strings (`dialect.TERMINAL_SQL`, what the
-- shared tables' `$terminal` stands for). So the text holds no other brace.
--
-- Its parameters are p_..., its columns o_...: neither may be read as a table's column.
-- p_at_floor: each claim and wake takes effect no earlier than the row's last change (`one_clock`).
-- p_flush: the commit waits for the WAL flush (a claim is durable before it is handed out).
-- p_details: per acknowledgement, how a diverged replay diverged (a suspension that parks the
-- execution: `tables.parking`), else NULL.
-- p_workflows: claim only executions of these workflows (routing); NULL: of any workflow.
CREATE FUNCTION pg_temp.yieldstar_batch(
    p_ids text[], p_tokens bigint[], p_statuses text[], p_results text[], p_errors text[], p_details text[],
    p_now bigint, p_limit bigint, p_duration bigint, p_holder text, p_at_floor boolean, p_flush boolean,
    p_workflows text[])
RETURNS TABLE (o_kind text, o_id text, o_token bigint, o_expires bigint, o_workflow text, o_input text)
LANGUAGE plpgsql AS $batch$
DECLARE
    found_row record;
    ended_ids text[] := ARRAY[]::text[];
    parked_ids text[] := ARRAY[]::text[];
    parked_details text[] := ARRAY[]::text[];
    woken_ids text[];
    woken_workflows text[];
BEGIN
    IF p_flush THEN
        PERFORM set_config('synchronous_commit', 'on', true);
    END IF;
    IF cardinality(p_ids) > 0 THEN
        FOR found_row IN
            WITH acks AS (
                SELECT * FROM unnest(p_ids, p_tokens, p_statuses, p_results, p_errors, p_details)
                    AS a(execution_id, token, status, result_json, error_json, detail)),
            acknowledged AS (
                UPDATE executions e SET status = a.status,
                    ever_suspended = CASE WHEN a.status = 'suspended' THEN 1 ELSE e.ever_suspended END,
                    result_json = CASE WHEN a.status = 'suspended' THEN e.result_json ELSE a.result_json END,
                    error_json = CASE WHEN a.status = 'suspended' THEN e.error_json ELSE a.error_json END,
                    lease_expires_at = NULL, unacknowledged_deliveries = 0, delivery_ended_at = NULL,
                    due_at = CASE WHEN a.status = 'suspended' AND a.detail IS NULL THEN e.wake_during_lease END,
                    ready_at = CASE WHEN a.status = 'suspended' AND a.detail IS NULL THEN e.wake_during_lease END,
                    wake_during_lease = NULL, updated_at = p_now
                FROM acks a
                WHERE e.execution_id = a.execution_id AND e.token = a.token AND e.status = 'running'
                RETURNING e.execution_id, e.token, a.status, a.detail),
            history AS (
                UPDATE lease_history h SET ended_at = p_now, ended_by = '{acknowledged}',
                    outcome = d.status
                FROM acknowledged d WHERE h.execution_id = d.execution_id AND h.token = d.token),
            announced AS (
                SELECT pg_notify('{ended_channel}',
                    CASE WHEN octet_length(string_agg(execution_id, E'\n')) <= {max_payload}
                    THEN string_agg(execution_id, E'\n') ELSE '' END)
                FROM acknowledged WHERE status <> 'suspended' HAVING count(*) > 0 AND NOT p_flush)
            SELECT execution_id, token, status, detail FROM acknowledged
            UNION ALL SELECT NULL, NULL, NULL, NULL FROM announced  -- read, so that it runs
        LOOP
            CONTINUE WHEN found_row.execution_id IS NULL;
            IF found_row.detail IS NOT NULL THEN
                parked_ids := parked_ids || found_row.execution_id;
                parked_details := parked_details || found_row.detail;
            END IF;
            IF found_row.status = 'suspended' THEN
                RETURN QUERY SELECT 'acknowledged', found_row.execution_id, found_row.token, NULL::bigint, NULL, NULL;
            ELSE
                RETURN QUERY SELECT 'ended', found_row.execution_id, found_row.token, NULL::bigint, NULL, NULL;
                ended_ids := ended_ids || found_row.execution_id;
            END IF;
        END LOOP;
    END IF;
    IF cardinality(parked_ids) > 0 THEN
        -- The parked executions' registrations (`tables.parking.PARK`), after their rows: only a
        -- batch with a diverged replay in it runs this.
        INSERT INTO waiters (kind, target, waiter, registered_at, detail)
        SELECT 'code', e.workflow, e.execution_id, p_now, p.detail
        FROM unnest(parked_ids, parked_details) AS p(execution_id, detail) JOIN executions e USING (execution_id)
        ON CONFLICT (kind, target, waiter) DO UPDATE
            SET registered_at = excluded.registered_at, detail = excluded.detail;
    END IF;
    IF cardinality(ended_ids) > 0 THEN
        -- The waiters of the executions ended, taken and woken by `ExecutionRows.wake_in`'s rules
        -- (an earlier due time; a running one remembers it for after its delivery, and its lease,
        -- with the redelivery delay, still decides). A statement of its own: one that read the
        -- waiters before an acknowledgement above waited for its row would miss a waiter that
        -- `await_outcome` registered meanwhile, holding that row.
        WITH taken AS (
            DELETE FROM waiters WHERE kind = 'execution' AND target = ANY(ended_ids) RETURNING waiter),
        woken AS (
        UPDATE executions e SET due_at = LEAST(e.due_at, p_now),
            wake_during_lease = CASE WHEN e.status = 'running' THEN LEAST(e.wake_during_lease, p_now) END,
            ready_at = CASE
                WHEN e.status = 'running' THEN GREATEST(LEAST(e.due_at, p_now),
                    e.lease_expires_at + pg_temp.yieldstar_delay(e.unacknowledged_deliveries + 1))
                WHEN e.unacknowledged_deliveries = 0 THEN LEAST(e.due_at, p_now)
                ELSE GREATEST(LEAST(e.due_at, p_now),
                    e.delivery_ended_at + pg_temp.yieldstar_delay(e.unacknowledged_deliveries)) END,
            updated_at = CASE WHEN p_at_floor THEN GREATEST(e.updated_at, p_now) ELSE p_now END
        FROM (SELECT DISTINCT waiter FROM taken) t
        WHERE e.execution_id = t.waiter AND e.status NOT IN ({terminal})
        RETURNING e.execution_id, e.workflow)
        SELECT array_agg(execution_id), array_agg(workflow) INTO woken_ids, woken_workflows FROM woken;
        IF woken_ids IS NOT NULL THEN
            -- A parked waiter, woken, is parked no more (`tables.parking`): its registration goes,
            -- in a statement after the rows' locks, in the order every wake takes them.
            DELETE FROM waiters w USING unnest(woken_ids, woken_workflows) AS k(id, workflow)
            WHERE w.kind = 'code' AND w.target = k.workflow AND w.waiter = k.id;
            RETURN QUERY SELECT 'woke', NULL::text, NULL::bigint, NULL::bigint, NULL, NULL;
        END IF;
    END IF;
    IF p_limit > 0 THEN
        -- The shared claimable rows (`tables.execution_rows.CLAIMABLE`: due rows earliest first,
        -- ties in admission order, then every running row whose lease expired and whose
        -- redelivery delay passed), the first p_limit of them by due time. A superseded delivery counts as unacknowledged and ends when its
        -- lease expired.
        RETURN QUERY
        WITH picked AS MATERIALIZED (
            SELECT *, CASE WHEN p_at_floor THEN GREATEST(p_now, updated_at) ELSE p_now END AS at,
                unacknowledged_deliveries + CASE WHEN status = 'running' THEN 1 ELSE 0 END AS unacked,
                CASE WHEN status = 'running' THEN lease_expires_at ELSE delivery_ended_at END AS ended_at
            FROM (
                SELECT * FROM (
                    SELECT 0 AS part, seq, {columns} FROM executions
                    WHERE p_workflows IS NULL
                        AND ready_at IS NOT NULL AND status <> 'running' AND due_at <= p_now AND ready_at <= p_now
                    ORDER BY due_at, seq LIMIT p_limit FOR UPDATE SKIP LOCKED) AS due
                UNION ALL
                -- Routing: the due rows of each workflow served, one index seek each
                -- (executions_claimable_by_workflow), so that due rows of workflows not served
                -- here, however many, are never read.
                SELECT 0, due_of.* FROM unnest(p_workflows) AS served (name) CROSS JOIN LATERAL (
                    SELECT seq, {columns} FROM executions
                    WHERE workflow = served.name
                        AND ready_at IS NOT NULL AND status <> 'running' AND due_at <= p_now AND ready_at <= p_now
                    ORDER BY due_at, seq LIMIT p_limit FOR UPDATE SKIP LOCKED) AS due_of
                UNION ALL
                SELECT * FROM (
                    SELECT 1, seq, {columns} FROM executions
                    WHERE status = 'running' AND ready_at <= p_now
                        AND (p_workflows IS NULL OR workflow = ANY(p_workflows)) FOR UPDATE SKIP LOCKED) AS expired
                ORDER BY due_at, part, seq LIMIT p_limit) AS claimable),
        claimed AS (
            UPDATE executions e SET token = p.token + 1, status = 'running', lease_expires_at = p.at + p_duration,
                unacknowledged_deliveries = p.unacked, delivery_ended_at = p.ended_at, wake_during_lease = NULL,
                ready_at = GREATEST(p.due_at, p.at + p_duration + pg_temp.yieldstar_delay(p.unacked + 1)),
                updated_at = p.at
            FROM picked p WHERE e.execution_id = p.execution_id
            RETURNING e.execution_id, e.token, e.lease_expires_at, e.updated_at, p.workflow, p.input_json,
                p.due_at, p.part, p.seq),
        superseded AS (
            UPDATE lease_history h SET ended_at = p.lease_expires_at, ended_by = '{superseded}',
                outcome = NULL, expires_at = p.lease_expires_at
            FROM picked p WHERE p.status = 'running' AND h.execution_id = p.execution_id AND h.token = p.token),
        opened AS (
            INSERT INTO lease_history (execution_id, token, holder, claimed_at, expires_at)
            SELECT c.execution_id, c.token, p_holder, c.updated_at, c.lease_expires_at FROM claimed c)
        SELECT 'claimed', c.execution_id, c.token, c.lease_expires_at, c.workflow,
            CASE WHEN c.token = 1 THEN c.input_json END
        FROM claimed c ORDER BY c.due_at, c.part, c.seq;
    END IF;
END
$batch$;
