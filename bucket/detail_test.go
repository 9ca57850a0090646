package bucket_test

import (
	"context"

	"github.com/sluicehq/sluice/bucket"
	"github.com/sluicehq/sluice/internal/enterdetail"
)

// report is what EnterReport tells, with the figures only the tests and
// the bench read (enterdetail).
type report struct {
	bucket.Report
	enterdetail.Detail
}

// enterReport is b.EnterReport(ctx, cost...) that also fills the detail.
func enterReport(ctx context.Context, b *bucket.Bucket, cost ...bucket.Cost) (report, error) {
	var d enterdetail.Detail
	rep, err := b.EnterReport(enterdetail.With(ctx, &d), cost...)
	return report{rep, d}, err
}
