-- dlock pglock, migration 1: the lease table and its token sequence.
-- {{table}} and {{sequence}} stand for the (quoted) names pglock uses:
-- by default dlock_leases and dlock_leases_token_seq. Run by
-- pglock.Migrate, or by hand with the names substituted.
CREATE TABLE IF NOT EXISTS {{table}} (
	key         text        PRIMARY KEY,
	owner       text        NOT NULL,
	token       bigint      NOT NULL,
	expires_at  timestamptz NOT NULL,
	metadata    jsonb       NOT NULL DEFAULT '{}'::jsonb,
	acquired_at timestamptz NOT NULL DEFAULT clock_timestamp()
);
CREATE SEQUENCE IF NOT EXISTS {{sequence}};
