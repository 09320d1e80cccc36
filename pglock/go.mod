module github.com/dlock-go/dlock/pglock

go 1.25.0

require (
	github.com/dlock-go/dlock v0.2.0
	github.com/jackc/pgx/v5 v5.12.0
	go.uber.org/goleak v1.3.0
)
