package consumer

// SetAfterCommit installs a hook run after each commit and before the
// acknowledgement; an error stands for a crash in between.
func SetAfterCommit(c *Consumer, f func(Event) error) { c.afterCommit = f }
