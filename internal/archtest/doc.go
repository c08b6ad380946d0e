// Package archtest holds the import rules of docs/architecture.md as tests,
// so that a change breaking one fails CI rather than waiting for a review.
// It has no code of its own.
package archtest
