package dispatch

// Exported for the tests of package dispatch_test.
var (
	Backoff  = backoff
	CheckURL = checkURL
)

// Classify is classify for a status and an error, as the verdict's name.
func Classify(status int, err error) string {
	return [...]string{"delivered", "retry", "gone"}[classify(attempt{status: status, err: err})]
}

// Describe is an attempt's last_error.
func Describe(status int, err error) string { return attempt{status: status, err: err}.describe() }
