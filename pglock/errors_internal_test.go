package pglock

import (
	"errors"
	"fmt"
	"testing"

	"github.com/dlock-go/dlock"
	"github.com/jackc/pgx/v5/pgconn"
)

// A session the server ended for idling in a transaction (25P03, what the
// locked reread's SET LOCAL timeout does to a stalled client) is an
// outage, as are the connection exceptions; other errors pass unchanged.
// Symptom: 25P03 was reported as a bare PostgreSQL error instead of an outage.
func TestOutage_ServerEndedSessionsAreUnavailable(t *testing.T) {
	for _, code := range []string{"08006", "53300", "57P01", "57P02", "57P03", "25P03"} {
		err := outage(fmt.Errorf("dlock: postgres acquire %q: %w", "k", &pgconn.PgError{Code: code}))
		if !errors.Is(err, dlock.ErrUnavailable) {
			t.Errorf("SQLSTATE %s: %v, want an error wrapping ErrUnavailable", code, err)
		}
	}
	for _, code := range []string{"42501", "23505", "40001"} {
		if err := outage(&pgconn.PgError{Code: code}); errors.Is(err, dlock.ErrUnavailable) {
			t.Errorf("SQLSTATE %s: %v, want it passed on unchanged", code, err)
		}
	}
}
