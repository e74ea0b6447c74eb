-- The executions table's batch on PostgreSQL, one call (see supervisor/ledger/postgres/executions.py):
-- the acknowledgements, the waiters of the executions they ended, and a claim. Each session makes
-- it for itself, in its own temporary schema, when it connects.
--
-- Read by `executions.batch_function()`, which fills in the names in braces from the Python
-- constants that are theirs (str.format): columns, the executions table's columns
-- (`tables.execution_rows.COLUMNS`); acknowledged, superseded and expired, how a delivery ended
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
RETURNS TABLE (o_kind text, o_id text, o_token bigint, o_expires bigint, o_workflow text, o_input text,
    o_trace text, o_queue text, o_due bigint)
LANGUAGE plpgsql AS $batch$
DECLARE
    found_row record;
    ended_ids text[] := ARRAY[]::text[];
    parked_ids text[] := ARRAY[]::text[];
    parked_details text[] := ARRAY[]::text[];
    woken_ids text[];
    woken_workflows text[];
    -- The claim's steps (`tables.queues`): the (workflow, queue) groups, expired leases, limits.
    served_names text[];
    g_workflows text[];
    g_queues text[];
    queue_keys text[];
    one_key text;
    x_ids text[];
    x_queues text[];
    limited record;
    candidate record;
    lq_names text[] := ARRAY[]::text[];
    lq_slots bigint[] := ARRAY[]::bigint[];
    lq_per_key bigint[] := ARRAY[]::bigint[];
    lq_rated boolean[] := ARRAY[]::boolean[];
    lq_live boolean[] := ARRAY[]::boolean[];  -- a concurrency or per_key limit: live leases counted
    fenced_queues text[] := ARRAY[]::text[];
    key_counts jsonb := '{{}}'::jsonb;
    candidate_ids text[] := ARRAY[]::text[];
    picked_ids text[] := ARRAY[]::text[];
    rated_queues text[] := ARRAY[]::text[];
    i int;
    room bigint;
    saturated text[];
    live bigint;
    recent bigint;
    some_ids text[];
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
                RETURN QUERY SELECT 'acknowledged', found_row.execution_id, found_row.token, NULL::bigint, NULL, NULL,
                    NULL, NULL, NULL::bigint;
            ELSE
                RETURN QUERY SELECT 'ended', found_row.execution_id, found_row.token, NULL::bigint, NULL, NULL,
                    NULL, NULL, NULL::bigint;
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
            RETURN QUERY SELECT 'woke', NULL::text, NULL::bigint, NULL::bigint, NULL, NULL, NULL, NULL, NULL::bigint;
        END IF;
    END IF;
    IF p_limit > 0 THEN
        -- The claim, by the steps of the shared one (`tables.queues`). The (workflow, queue) groups
        -- that hold claimable rows, of each workflow served: a loose scan, a seek per group, in
        -- the claimable index (workflow, queue, priority DESC, due_at, seq). Each seek orders by
        -- the index's leading columns, fixed ones included, so that the planner takes that index
        -- even without statistics. A claim of any workflow first finds the workflows that have
        -- claimable rows, by a loose scan of it too.
        served_names := p_workflows;
        IF p_workflows IS NULL THEN
            WITH RECURSIVE names (workflow) AS (
                SELECT (SELECT e.workflow FROM executions e WHERE e.ready_at IS NOT NULL AND e.status <> 'running'
                        ORDER BY e.workflow LIMIT 1)
                UNION ALL
                SELECT (SELECT e.workflow FROM executions e WHERE e.ready_at IS NOT NULL AND e.status <> 'running'
                            AND e.workflow > names.workflow ORDER BY e.workflow LIMIT 1)
                FROM names WHERE names.workflow IS NOT NULL)
            SELECT coalesce(array_agg(workflow), ARRAY[]::text[]) INTO served_names FROM names WHERE workflow IS NOT NULL;
        END IF;
        WITH RECURSIVE pairs (workflow, queue) AS (
            SELECT served.name, ''::text FROM unnest(served_names) AS served (name)
            UNION ALL
            SELECT pairs.workflow, (SELECT e.queue FROM executions e
                     WHERE e.workflow = pairs.workflow AND e.ready_at IS NOT NULL AND e.status <> 'running'
                         AND e.queue > pairs.queue ORDER BY e.workflow, e.queue LIMIT 1)
            FROM pairs WHERE pairs.queue IS NOT NULL)
        SELECT array_agg(workflow), array_agg(queue) INTO g_workflows, g_queues
        FROM pairs WHERE queue IS NOT NULL AND queue <> '';
        -- Expired leases (dead holders'), locked: few.
        WITH expired AS (
            SELECT e.execution_id, e.queue FROM executions e
            WHERE e.status = 'running' AND e.ready_at <= p_now
                AND (p_workflows IS NULL OR e.workflow = ANY(p_workflows)) FOR UPDATE SKIP LOCKED)
        SELECT array_agg(execution_id), array_agg(queue) INTO x_ids, x_queues FROM expired;
        -- The limited queues among them. First a look without locks: a queue found saturated
        -- is left alone (claiming less than it could is safe, and the next claim looks again), so
        -- that polls behind a saturated queue take no row lock, and write nothing.
        FOR limited IN
            SELECT q.name, q.concurrency, q.rate_count, q.rate_ms FROM queues q
            WHERE q.name = ANY(coalesce(g_queues, ARRAY[]::text[]) || coalesce(x_queues, ARRAY[]::text[]))
        LOOP
            room := NULL;
            IF limited.concurrency IS NOT NULL THEN
                SELECT count(*) INTO live FROM executions e
                WHERE e.queue = limited.name AND e.status = 'running' AND e.lease_expires_at > p_now;
                room := limited.concurrency - live;
            END IF;
            IF limited.rate_count IS NOT NULL THEN
                SELECT count(*) INTO recent FROM queue_claims c
                WHERE c.queue = limited.name AND c.claimed_at > p_now - limited.rate_ms;
                room := LEAST(coalesce(room, limited.rate_count - recent), limited.rate_count - recent);
            END IF;
            IF room IS NOT NULL AND room <= 0 THEN
                lq_names := lq_names || limited.name;
                lq_slots := lq_slots || 0::bigint;
                lq_per_key := lq_per_key || NULL::bigint;
                lq_rated := lq_rated || false;
                lq_live := lq_live || false;  -- nothing is taken of it
            END IF;
        END LOOP;
        -- The others, their rows locked in name order (so that claimers of one queue take turns
        -- and never deadlock), then counted again in statements that start after the lock was
        -- granted: under READ COMMITTED each sees every claim committed before it.
        FOR limited IN
            SELECT q.name, q.concurrency, q.per_key, q.rate_count, q.rate_ms FROM queues q
            WHERE q.name = ANY(coalesce(g_queues, ARRAY[]::text[]) || coalesce(x_queues, ARRAY[]::text[]))
                AND NOT (q.name = ANY(lq_names))
            ORDER BY q.name FOR UPDATE
        LOOP
            room := NULL;
            IF limited.concurrency IS NOT NULL OR limited.per_key IS NOT NULL THEN
                live := 0;
                FOR candidate IN
                    SELECT e.queue_key AS k, count(*) AS n FROM executions e
                    WHERE e.queue = limited.name AND e.status = 'running' AND e.lease_expires_at > p_now
                    GROUP BY e.queue_key
                LOOP
                    live := live + candidate.n;
                    IF candidate.k IS NOT NULL THEN
                        key_counts := key_counts || jsonb_build_object(limited.name || chr(31) || candidate.k, candidate.n);
                    END IF;
                END LOOP;
                IF limited.concurrency IS NOT NULL THEN
                    room := limited.concurrency - live;
                END IF;
            END IF;
            IF limited.rate_count IS NOT NULL THEN
                DELETE FROM queue_claims c WHERE c.queue = limited.name AND c.claimed_at <= p_now - limited.rate_ms;
                SELECT count(*) INTO recent FROM queue_claims c
                WHERE c.queue = limited.name AND c.claimed_at > p_now - limited.rate_ms;
                room := LEAST(coalesce(room, limited.rate_count - recent), limited.rate_count - recent);
            END IF;
            lq_names := lq_names || limited.name;
            lq_slots := lq_slots || room;
            lq_per_key := lq_per_key || limited.per_key::bigint;
            lq_rated := lq_rated || (limited.rate_count IS NOT NULL);
            lq_live := lq_live || (limited.concurrency IS NOT NULL OR limited.per_key IS NOT NULL);
        END LOOP;
        -- The due rows of each group whose queue has room, at most that room (keys at per_key
        -- left out), locked: a saturated queue's group is not read.
        FOR i IN 1 .. coalesce(cardinality(g_queues), 0) LOOP
            room := p_limit;
            saturated := ARRAY[]::text[];
            IF g_queues[i] = ANY(lq_names) THEN
                IF lq_slots[array_position(lq_names, g_queues[i])] IS NOT NULL THEN
                    room := LEAST(room, lq_slots[array_position(lq_names, g_queues[i])]);
                END IF;
                IF lq_per_key[array_position(lq_names, g_queues[i])] IS NOT NULL THEN
                    SELECT coalesce(array_agg(substr(j.key, length(g_queues[i]) + 2)), ARRAY[]::text[]) INTO saturated
                    FROM jsonb_each_text(key_counts) j
                    WHERE starts_with(j.key, g_queues[i] || chr(31))
                        AND j.value::bigint >= lq_per_key[array_position(lq_names, g_queues[i])];
                END IF;
            END IF;
            CONTINUE WHEN room <= 0;
            -- A queue holding saturated keys is read key by key, in the index of (queue,
            -- queue_key, workflow, priority DESC, due_at, seq): a seek per key of the queue, and
            -- one for the rows without a key, so that a hot key's backlog is not read. Unless it
            -- holds 32 keys or more (queues.KEYS_AT_MOST): then the saturated keys' rows are
            -- stepped over in the group's order.
            queue_keys := NULL;
            IF cardinality(saturated) > 0 THEN
                WITH RECURSIVE keys (k, n) AS (
                    SELECT ''::text, 0
                    UNION ALL
                    SELECT (SELECT e.queue_key FROM executions e
                            WHERE e.queue = g_queues[i] AND e.queue_key > keys.k AND e.ready_at IS NOT NULL
                                AND e.status <> 'running' ORDER BY e.queue, e.queue_key LIMIT 1), keys.n + 1
                    FROM keys WHERE keys.k IS NOT NULL AND keys.n < 32)
                SELECT coalesce(array_agg(k), ARRAY[]::text[]) INTO queue_keys FROM keys WHERE k IS NOT NULL AND n > 0;
                IF cardinality(queue_keys) >= 32 THEN
                    queue_keys := NULL;
                END IF;
            END IF;
            IF queue_keys IS NULL THEN
                WITH due AS (
                    SELECT e.execution_id FROM executions e
                    WHERE e.workflow = g_workflows[i] AND e.queue = g_queues[i]
                        AND e.ready_at IS NOT NULL AND e.status <> 'running' AND e.due_at <= p_now AND e.ready_at <= p_now
                        AND (e.queue_key IS NULL OR NOT (e.queue_key = ANY(saturated)))
                    ORDER BY e.workflow, e.queue, e.priority DESC, e.due_at, e.seq LIMIT room FOR UPDATE SKIP LOCKED)
                SELECT array_agg(execution_id) INTO some_ids FROM due;
                candidate_ids := candidate_ids || coalesce(some_ids, ARRAY[]::text[]);
                CONTINUE;
            END IF;
            WITH due AS (
                SELECT e.execution_id FROM executions e
                WHERE e.queue = g_queues[i] AND e.queue_key IS NULL AND e.workflow = g_workflows[i]
                    AND e.ready_at IS NOT NULL AND e.status <> 'running' AND e.due_at <= p_now AND e.ready_at <= p_now
                ORDER BY e.queue, e.queue_key, e.workflow, e.priority DESC, e.due_at, e.seq LIMIT room
                FOR UPDATE SKIP LOCKED)
            SELECT array_agg(execution_id) INTO some_ids FROM due;
            candidate_ids := candidate_ids || coalesce(some_ids, ARRAY[]::text[]);
            FOREACH one_key IN ARRAY queue_keys LOOP
                CONTINUE WHEN one_key = ANY(saturated);
                WITH due AS (
                    SELECT e.execution_id FROM executions e
                    WHERE e.queue = g_queues[i] AND e.queue_key = one_key AND e.workflow = g_workflows[i]
                        AND e.ready_at IS NOT NULL AND e.status <> 'running' AND e.due_at <= p_now AND e.ready_at <= p_now
                    ORDER BY e.queue, e.queue_key, e.workflow, e.priority DESC, e.due_at, e.seq
                    LIMIT LEAST(room, lq_per_key[array_position(lq_names, g_queues[i])]
                        - coalesce((key_counts ->> (g_queues[i] || chr(31) || one_key))::bigint, 0))
                    FOR UPDATE SKIP LOCKED)
                SELECT array_agg(execution_id) INTO some_ids FROM due;
                candidate_ids := candidate_ids || coalesce(some_ids, ARRAY[]::text[]);
            END LOOP;
        END LOOP;
        -- By priority, then due time (due rows before expired leases, then admission order),
        -- taken while their queue and key have room.
        FOR candidate IN
            SELECT e.execution_id AS id, e.queue AS q, e.queue_key AS k FROM executions e
            WHERE e.execution_id = ANY(candidate_ids || coalesce(x_ids, ARRAY[]::text[]))
            ORDER BY e.priority DESC, e.due_at, (e.status = 'running'), e.seq
        LOOP
            EXIT WHEN cardinality(picked_ids) >= p_limit;
            i := array_position(lq_names, candidate.q);
            IF i IS NOT NULL THEN
                CONTINUE WHEN lq_slots[i] IS NOT NULL AND lq_slots[i] <= 0;
                CONTINUE WHEN lq_per_key[i] IS NOT NULL AND candidate.k IS NOT NULL
                    AND coalesce((key_counts ->> (candidate.q || chr(31) || candidate.k))::bigint, 0) >= lq_per_key[i];
                IF lq_slots[i] IS NOT NULL THEN
                    lq_slots[i] := lq_slots[i] - 1;
                END IF;
                IF candidate.k IS NOT NULL THEN
                    key_counts := key_counts || jsonb_build_object(candidate.q || chr(31) || candidate.k,
                        coalesce((key_counts ->> (candidate.q || chr(31) || candidate.k))::bigint, 0) + 1);
                END IF;
                IF lq_rated[i] THEN
                    rated_queues := rated_queues || candidate.q;
                END IF;
                IF lq_live[i] AND NOT (candidate.q = ANY(fenced_queues)) THEN
                    fenced_queues := fenced_queues || candidate.q;
                END IF;
            END IF;
            picked_ids := picked_ids || candidate.id;
        END LOOP;
        IF cardinality(rated_queues) > 0 THEN
            INSERT INTO queue_claims (queue, claimed_at) SELECT unnest(rated_queues), p_now;
        END IF;
        -- The run-out deliveries of the queues whose live leases were counted and a slot taken
        -- (`tables.leases.END_LAPSED`): they were counted free, so they end, expired at their
        -- lease's expiry, and are never renewed again. A row another transaction holds is passed
        -- over (its holder's renewal, which refuses a run-out lease of such a queue itself).
        IF cardinality(fenced_queues) > 0 THEN
            WITH lapsed AS (
                SELECT e.execution_id FROM executions e
                WHERE e.queue = ANY(fenced_queues) AND e.status = 'running' AND e.lease_expires_at <= p_now
                    AND NOT (e.execution_id = ANY(picked_ids))
                FOR UPDATE SKIP LOCKED),
            ended AS (
                UPDATE executions e SET status = CASE e.ever_suspended WHEN 1 THEN 'suspended' ELSE 'admitted' END,
                    lease_expires_at = NULL, unacknowledged_deliveries = e.unacknowledged_deliveries + 1,
                    delivery_ended_at = e.lease_expires_at, wake_during_lease = NULL,
                    ready_at = pg_temp.yieldstar_max(e.due_at,
                        e.lease_expires_at + pg_temp.yieldstar_delay(e.unacknowledged_deliveries + 1)),
                    updated_at = p_now
                FROM lapsed l WHERE e.execution_id = l.execution_id
                RETURNING e.execution_id, e.token, e.delivery_ended_at)
            UPDATE lease_history h SET ended_at = x.delivery_ended_at, ended_by = '{expired}', outcome = NULL,
                expires_at = x.delivery_ended_at
            FROM ended x WHERE h.execution_id = x.execution_id AND h.token = x.token;
        END IF;
        -- A superseded delivery counts as unacknowledged and ends when its lease expired.
        RETURN QUERY
        WITH picked AS MATERIALIZED (
            SELECT *, CASE WHEN p_at_floor THEN GREATEST(p_now, updated_at) ELSE p_now END AS at,
                unacknowledged_deliveries + CASE WHEN status = 'running' THEN 1 ELSE 0 END AS unacked,
                CASE WHEN status = 'running' THEN lease_expires_at ELSE delivery_ended_at END AS ended_at,
                CASE WHEN status = 'running' THEN 1 ELSE 0 END AS part
            FROM executions WHERE execution_id = ANY(picked_ids)),
        claimed AS (
            UPDATE executions e SET token = p.token + 1, status = 'running', lease_expires_at = p.at + p_duration,
                unacknowledged_deliveries = p.unacked, delivery_ended_at = p.ended_at, wake_during_lease = NULL,
                ready_at = GREATEST(p.due_at, p.at + p_duration + pg_temp.yieldstar_delay(p.unacked + 1)),
                updated_at = p.at
            FROM picked p WHERE e.execution_id = p.execution_id
            RETURNING e.execution_id, e.token, e.lease_expires_at, e.updated_at, p.workflow, p.input_json,
                p.due_at, p.part, p.seq, p.priority, p.trace_context, p.queue, p.ended_at),
        superseded AS (
            UPDATE lease_history h SET ended_at = p.lease_expires_at, ended_by = '{superseded}',
                outcome = NULL, expires_at = p.lease_expires_at
            FROM picked p WHERE p.status = 'running' AND h.execution_id = p.execution_id AND h.token = p.token),
        opened AS (
            INSERT INTO lease_history (execution_id, token, holder, claimed_at, expires_at)
            SELECT c.execution_id, c.token, p_holder, c.updated_at, c.lease_expires_at FROM claimed c)
        SELECT 'claimed', c.execution_id, c.token, c.lease_expires_at, c.workflow,
            CASE WHEN c.token = 1 THEN c.input_json END, c.trace_context, c.queue,
            CASE WHEN c.part = 1 THEN GREATEST(c.due_at, c.ended_at) ELSE c.due_at END
        FROM claimed c ORDER BY c.priority DESC, c.due_at, c.part, c.seq;
    END IF;
END
$batch$;
