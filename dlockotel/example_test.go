package dlockotel_test

import (
	"context"
	"fmt"

	"github.com/dlock-go/dlock/dlockotel"
	"github.com/dlock-go/dlock/memlock"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
)

// Wrapping a Locker traces it: an acquire span and a hold span under the
// caller's span. A real program keeps the global TracerProvider (the
// default) and exports in batches; the test exports to memory.
func Example() {
	exp := tracetest.NewInMemoryExporter()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSyncer(exp))
	defer tp.Shutdown(context.Background())

	locker := dlockotel.Wrap(memlock.New(), dlockotel.WithTracerProvider(tp))

	ctx, job := tp.Tracer("app").Start(context.Background(), "nightly-report")
	lk, err := locker.Acquire(ctx, "report")
	if err != nil {
		panic(err)
	}
	lk.Release(ctx)
	job.End()

	for _, s := range exp.GetSpans() {
		fmt.Println(s.Name, "child of the job:", s.Parent.SpanID() == job.SpanContext().SpanID())
	}
	// Output:
	// dlock.acquire child of the job: true
	// dlock.hold child of the job: true
	// nightly-report child of the job: false
}
