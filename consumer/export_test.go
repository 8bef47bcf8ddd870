package consumer

// JoinedGeneration is the member ID and generation the consumer took from
// kafka-go's join record (joinLogger); ok is false if it saw none.
func (c *Consumer) JoinedGeneration() (member string, generation int32, ok bool) {
	j := c.joined.Load()
	if j == nil {
		return "", 0, false
	}
	return j.member, j.generation, true
}
