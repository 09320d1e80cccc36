-- dlock pglock, migration 2: shared and limited holders, waiting writers.
-- {{table}}, {{holders}} and {{writers}} stand for the (quoted) names
-- pglock uses: by default dlock_leases, dlock_leases_holders and
-- dlock_leases_writers. Run by pglock.Migrate, or by hand with the names
-- substituted. Every statement is idempotent, and an existing lease table
-- is upgraded in place (columns with a constant default: no rewrite).
--
-- The key's row in {{table}} stays the exclusive lease and becomes the
-- key's gate: every shared or limited grant and every renewal of one
-- updates it (gen), so a grant deciding on a snapshot of the holders
-- can tell, under the row's lock, whether they changed since. hmode and
-- hlimit are the mode (1 shared, 2 limited) and limit of the key's last
-- shared or limited grant.
ALTER TABLE {{table}} ADD COLUMN IF NOT EXISTS gen bigint NOT NULL DEFAULT 0;
ALTER TABLE {{table}} ADD COLUMN IF NOT EXISTS hmode smallint NOT NULL DEFAULT 0;
ALTER TABLE {{table}} ADD COLUMN IF NOT EXISTS hlimit integer NOT NULL DEFAULT 0;
-- One row per shared or limited holder: its own owner, token and expiry.
-- A release marks the row (released, expires_at set to the release's
-- time) so that a retried release finds it; grants on the key delete rows
-- that ended more than five minutes ago.
CREATE TABLE IF NOT EXISTS {{holders}} (
	key         text        NOT NULL,
	owner       text        NOT NULL,
	mode        smallint    NOT NULL,
	token       bigint      NOT NULL,
	expires_at  timestamptz NOT NULL,
	released    boolean     NOT NULL DEFAULT false,
	metadata    jsonb       NOT NULL DEFAULT '{}'::jsonb,
	acquired_at timestamptz NOT NULL DEFAULT clock_timestamp(),
	PRIMARY KEY (key, owner)
);
-- Waiting writers (writer preference): one row per blocking exclusive
-- Acquire refused, expiring a TTL after its last attempt.
CREATE TABLE IF NOT EXISTS {{writers}} (
	key        text        NOT NULL,
	waiter     text        NOT NULL,
	expires_at timestamptz NOT NULL,
	PRIMARY KEY (key, waiter)
);
