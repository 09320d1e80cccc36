// Package pglock is dlock's PostgreSQL backend, on pgx (pgxpool): leases in
// a table, expiring by the database's clock, fencing tokens from a
// sequence, wake-ups by LISTEN/NOTIFY with a bounded poll as fallback, and
// no session state between statements, so it works behind transaction
// poolers (PgBouncer in transaction mode).
package pglock
