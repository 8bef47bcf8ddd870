package consumer

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/segmentio/kafka-go"
)

// This file sends offset commits: the commit loop's, the final one of a
// shutdown, and the one of a revocation (commitRevoked).
//
// Every commit names the group generation whose messages it covers, the
// one the member joined last (joinLogger), read together with the commit
// points while no revocation runs (r.genMu): the messages of a generation
// are fetched only after its join, and the next join waits for the
// revocation. So the broker takes a commit only while that generation is
// the group's, and refuses it (ILLEGAL_GENERATION, UNKNOWN_MEMBER_ID) once
// the partitions may have another owner. kafka-go's Reader.CommitMessages
// does not: it queues the request, and a request queued after its
// generation ended is sent by the next generation's commit loop, in the
// new generation, over what the revocation committed (seen as a
// partition's committed offset going back from 60 to 32).
//
// Commits of one generation are sent one at a time (r.commitMu): the
// broker applies them in the order it receives them, and an older one
// arriving last would move a partition's offset back.

// commitTimeout bounds one offset commit, the final one of a shutdown
// included. It does not depend on Config.DrainTimeout: a drain cut short
// must not cut the commit of what was done short too.
const commitTimeout = 10 * time.Second

// commitLoop commits progress whenever there is some, at most once per
// Config.CommitInterval, and once more when stop is closed (after the
// workers have finished). Each commit may take up to commitTimeout; ctx
// is not cancelled, not even when Run aborts.
func (c *Consumer) commitLoop(ctx context.Context, r *run, stop <-chan struct{}) {
	failures := 0
	for {
		select {
		case <-r.dirty:
		case <-stop:
			c.commit(ctx, r) // the final commit
			return
		}
		pause := c.cfg.CommitInterval
		if c.commit(ctx, r) {
			failures = 0
		} else {
			failures++
			pause = max(pause, backoff(failures, 100*time.Millisecond, 5*time.Second))
			select { // try again even without new progress
			case r.dirty <- struct{}{}:
			default:
			}
		}
		if pause > 0 {
			t := time.NewTimer(pause)
			select {
			case <-t.C:
			case <-stop:
				t.Stop()
			}
		}
	}
}

// commit sends one commit covering every partition that has progress. It
// reports false when the commit failed and may be tried again.
func (c *Consumer) commit(ctx context.Context, r *run) bool {
	r.commitMu.Lock()
	defer r.commitMu.Unlock()
	r.genMu.Lock()
	if r.revoking {
		r.genMu.Unlock()
		return true // revoke commits what is done, in the generation that ended
	}
	g := r.gen
	pts := r.tr.ready()
	j := c.joined.Load()
	r.genMu.Unlock()
	if len(pts) == 0 {
		return true
	}
	ctx, cancel := context.WithTimeout(ctx, commitTimeout)
	defer cancel()
	err := c.sendCommit(ctx, r, j, g, pts)
	switch {
	case err == nil:
	case g.isRevoked():
		// Its generation ended: the revocation commits what is done, or
		// the broker has moved on and the next owners handle it again.
		c.log.Debug("offset commit of revoked partitions dropped", "partitions", len(pts), "err", err)
		return true
	default:
		c.count.commitErrors.Add(1)
		c.log.Warn("offset commit failed; retrying", "err", err, "partitions", len(pts))
		return false
	}
	c.count.commits.Add(1)
	r.tr.committed(pts)
	return true
}

// commitRevoked commits the done prefix of every partition of the
// generation that ended, in that generation (see revoke.go). It runs
// while r.revoking holds: nothing else starts a commit, and no message is
// added to the books.
func (c *Consumer) commitRevoked(r *run) {
	r.commitMu.Lock() // a commit of the loop may still be on its way
	defer r.commitMu.Unlock()
	pts := r.tr.ready()
	if len(pts) == 0 {
		return
	}
	j := c.joined.Load()
	if j == nil {
		c.log.Warn("the group generation that ended is not known: its done messages are not committed, their partitions' next owners handle them again", "partitions", len(pts))
		return
	}
	// Not cut by an abort, like a shutdown's final commit; bounded so that
	// the member joins again within the rebalance timeout, after the grace.
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.work), c.revokeCommitTimeout())
	defer cancel()
	if err := c.sendCommit(ctx, r, j, nil, pts); err != nil {
		c.count.commitErrors.Add(1)
		c.log.Warn("offset commit of revoked partitions failed: their next owners handle their done messages again",
			"err", err, "partitions", len(pts), "generation", j.generation)
		return
	}
	c.count.commits.Add(1)
	r.tr.committed(pts)
	c.log.Debug("revoked partitions committed", "partitions", len(pts), "generation", j.generation)
}

// revokeCommitTimeout bounds commitRevoked: commitTimeout, but at most a
// quarter of the group's rebalance timeout (the grace takes at most half).
func (c *Consumer) revokeCommitTimeout() time.Duration {
	return min(commitTimeout, c.rebalanceTimeout()/4)
}

// sendCommit commits pts in generation j. With j nil (kafka-go's join
// record was not recognised) it falls back to the Reader's
// CommitMessages, cut when g is revoked; a request it had queued may then
// still be sent in the next generation (see the top of this file).
func (c *Consumer) sendCommit(ctx context.Context, r *run, j *groupJoin, g *generation, pts []commitPoint) error {
	if j == nil {
		ctx, cancel := context.WithCancel(ctx)
		defer cancel()
		if g != nil {
			defer context.AfterFunc(g.revoked, cancel)()
		}
		return r.reader.CommitMessages(ctx, messages(pts)...)
	}
	topics := map[string][]kafka.OffsetCommit{}
	for _, pt := range pts {
		tp := pt.seg.part.tp
		topics[tp.topic] = append(topics[tp.topic], kafka.OffsetCommit{Partition: tp.partition, Offset: pt.last + 1})
	}
	resp, err := c.group.OffsetCommit(ctx, &kafka.OffsetCommitRequest{
		GroupID:      c.cfg.GroupID,
		GenerationID: int(j.generation),
		MemberID:     j.member,
		Topics:       topics,
	})
	if err != nil {
		return err
	}
	var errs []error
	for _, ps := range resp.Topics {
		for _, p := range ps {
			if p.Error != nil {
				errs = append(errs, fmt.Errorf("partition %d: %w", p.Partition, p.Error))
			}
		}
	}
	return errors.Join(errs...)
}
