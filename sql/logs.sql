-- Attempt logs in the control plane. A runner keeps each attempt's whole
-- log in a file on its host and also ships the lines here, in batches,
-- while the attempt runs: so the API and the console can show (and follow)
-- a log without reaching the runner's host. A bounded number of lines per
-- attempt is kept (orca.log_lines_max); the file has the rest.

CREATE TABLE orca.attempt_logs (
    org_id     bigint NOT NULL,
    attempt_id bigint NOT NULL,
    -- 1 for the attempt's first line; the runner numbers them, so a batch
    -- sent twice (a retry after a lost answer) is kept once.
    seq        integer NOT NULL CHECK (seq >= 1),
    at         timestamptz NOT NULL DEFAULT now(),
    line       text NOT NULL,
    PRIMARY KEY (attempt_id, seq),
    FOREIGN KEY (org_id, attempt_id) REFERENCES orca.attempts (org_id, id) ON DELETE CASCADE
);
COMMENT ON TABLE orca.attempt_logs IS
'The lines of each attempt''s log (its child''s output and the runner''s own lines), shipped by '
'the runner while the attempt runs; at most orca.log_lines_max per attempt, each at most 8 KiB. '
'Pruned with its run.';
ALTER TABLE orca.attempt_logs ENABLE ROW LEVEL SECURITY;
CREATE POLICY org_scope ON orca.attempt_logs USING (org_id = (SELECT orca.current_org_id()));
SELECT pg_catalog.pg_extension_config_dump('orca.attempt_logs', '');

CREATE FUNCTION orca.append_log(lease uuid, first_seq integer, lines text[]) RETURNS integer
LANGUAGE plpgsql VOLATILE SECURITY DEFINER SET search_path = pg_catalog, pg_temp AS $$
#variable_conflict use_column
DECLARE
    v_bounded boolean := orca._bound('append_log', 'lines', octet_length(array_to_string(append_log.lines, '', '')) + cardinality(append_log.lines), 8388608);
    t     orca.runner_tokens := orca._runner_session();
    v_org bigint := t.org_id;
    a     orca.attempts;
    v_max integer := orca._log_lines_max();
    v_n   integer;
BEGIN
    IF append_log.first_seq IS NULL OR append_log.first_seq < 1 THEN
        RAISE EXCEPTION 'first_seq must be 1 or more, got %', coalesce(append_log.first_seq::text, 'NULL')
            USING ERRCODE = 'OR050';
    END IF;
    IF append_log.lines IS NULL OR cardinality(append_log.lines) > 1000 THEN
        RAISE EXCEPTION 'lines must be an array of at most 1000 lines, got %',
                        coalesce(cardinality(append_log.lines)::text || ' lines', 'NULL')
            USING ERRCODE = 'OR050',
                  HINT = 'send a long log in batches';
    END IF;
    PERFORM orca._lease_holder(t, append_log.lease);
    a := orca._leased_attempt(v_org, append_log.lease);
    INSERT INTO orca.attempt_logs (org_id, attempt_id, seq, line)
    SELECT a.org_id, a.id, append_log.first_seq + x.i - 1, left(coalesce(x.line, ''), 8192)
    FROM unnest(append_log.lines) WITH ORDINALITY AS x(line, i)
    WHERE append_log.first_seq + x.i - 1 <= v_max
    ON CONFLICT (attempt_id, seq) DO NOTHING;
    GET DIAGNOSTICS v_n = ROW_COUNT;
    RETURN v_n;
END
$$;
COMMENT ON FUNCTION orca.append_log(uuid, integer, text[]) IS
'For runners: adds lines to the log of the attempt the lease holds, numbered from first_seq '
'(a batch sent again is kept once). Lines past orca.log_lines_max are not kept; each is cut at '
'8 KiB. Returns the lines kept. Errors: OR050 (first_seq < 1, more than 1000 lines), OR012, '
'OR014 (the lease is no longer active).';
