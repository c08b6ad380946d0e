package httpapi_test

import (
	"strings"
	"testing"
)

// pgbouncerSuite is the test under which setup puts the API's pool behind
// PgBouncer in transaction pooling mode.
const pgbouncerSuite = "TestIdempotencyThroughPgBouncer"

// throughPgBouncer reports whether t runs under pgbouncerSuite.
func throughPgBouncer(t *testing.T) bool { return strings.HasPrefix(t.Name(), pgbouncerSuite+"/") }

// TestIdempotencyThroughPgBouncer runs the idempotency suite again with the
// API's pool behind PgBouncer in transaction mode (Debian's 1.18: no
// prepared statements across transactions, no startup parameter it does
// not know): the same claims, waits, replays, lookups and rechecks of a
// lost COMMIT reply hold when each transaction may run on another backend.
func TestIdempotencyThroughPgBouncer(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		test func(*testing.T)
	}{
		{"FailureBeforeCommitRollsBackEverything", TestFailureBeforeCommitRollsBackEverything},
		{"LostPostCommitResponseIsReplayed", TestLostPostCommitResponseIsReplayed},
		{"ClientDisconnectDoesNotAbortCommit", TestClientDisconnectDoesNotAbortCommit},
		{"IdenticalReplayReturnsRecordedResponse", TestIdenticalReplayReturnsRecordedResponse},
		{"ChangedParametersUnderSameKeyAreRefused", TestChangedParametersUnderSameKeyAreRefused},
		{"NewKeyWithIdenticalContentIsANewNote", TestNewKeyWithIdenticalContentIsANewNote},
		{"SameKeyInTwoTenantsIsTwoOperations", TestSameKeyInTwoTenantsIsTwoOperations},
		{"SameKeyForAnotherActionIsRefused", TestSameKeyForAnotherActionIsRefused},
		{"ValidationFailuresAreNotRecorded", TestValidationFailuresAreNotRecorded},
		{"ConcurrentIdenticalRequestsExecuteOnce", TestConcurrentIdenticalRequestsExecuteOnce},
		{"WaitingRequestsDoNotStarveOtherTenants", TestWaitingRequestsDoNotStarveOtherTenants},
		{"PreferWaitZeroAnswersInProgressAtOnce", TestPreferWaitZeroAnswersInProgressAtOnce},
		{"ConnectionLostBeforeCommitIsRechecked", TestConnectionLostBeforeCommitIsRechecked},
		{"LostCommitReplyIsRecheckedAndAnsweredWithTheOutcome", TestLostCommitReplyIsRecheckedAndAnsweredWithTheOutcome},
		{"LookupCompletedOperation", TestLookupCompletedOperation},
		{"LookupWhileExecutingIsInProgressNeverNotFound", TestLookupWhileExecutingIsInProgressNeverNotFound},
		{"RetentionExpiredAnswers410ThenForgottenExecutes", TestRetentionExpiredAnswers410ThenForgottenExecutes},
		{"ConcurrentLookupsDoNotSeeEachOtherAsInProgress", TestConcurrentLookupsDoNotSeeEachOtherAsInProgress},
		{"DeleteNote", TestDeleteNote},
		{"DeleteOfALockedNoteAnswersWithinTheLockTimeout", TestDeleteOfALockedNoteAnswersWithinTheLockTimeout},
	} {
		t.Run(tc.name, tc.test)
	}
}
