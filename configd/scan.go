package main

import (
	"context"
	"strings"

	"go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/sluice-go/sluice/internal/schema"
)

// scanProviders walks every provider that has a key under keys.Providers(),
// in key order, reading for each only what ops asks for, all at one
// revision (the first read's), which it returns. It is how list and the
// leader's load avoid reading history entries: a provider's keys are never
// fetched as one prefix, so however long its history, it costs nothing
// unless ops asks for it.
//
// at is the revision to read at; 0: the current one.
//
// It is a skip scan, one transaction per provider (P+1 round trips for P
// providers): the reads ops(name, rev) returns, which should read at rev
// (clientv3.WithRev) so that the scan is one snapshot, plus a keys-only
// read of the first key after the provider's prefix, which names the next
// provider. visit gets name and one response per op, in order.
// name is the path segment after keys.Providers() and may be an invalid
// provider name (a key written by hand); visit decides what to do with the
// keys it reads. A stray key directly under keys.Providers() (no provider
// segment) is passed to stray, keys only, and stepped over.
func scanProviders(ctx context.Context, cli *clientv3.Client, keys schema.Keys, at int64,
	ops func(name string, rev int64) []clientv3.Op,
	visit func(name string, resps []*etcdserverpb.ResponseOp),
	stray func(kv *mvccpb.KeyValue),
) (int64, error) {
	root := keys.Providers()
	end := clientv3.GetPrefixRangeEnd(root)
	first := func(from string, rev int64) clientv3.Op {
		opts := []clientv3.OpOption{clientv3.WithRange(end), clientv3.WithKeysOnly(), clientv3.WithLimit(1)}
		if rev > 0 {
			opts = append(opts, clientv3.WithRev(rev))
		}
		return clientv3.OpGet(from, opts...)
	}
	resp, err := cli.Do(ctx, first(root, at))
	if err != nil {
		return 0, etcdError(err)
	}
	rev := resp.Get().Header.Revision
	kvs := resp.Get().Kvs
	for len(kvs) > 0 {
		key := string(kvs[0].Key)
		name, _, ok := strings.Cut(strings.TrimPrefix(key, root), "/")
		var batch []clientv3.Op
		if ok {
			batch = append(ops(name, rev), first(clientv3.GetPrefixRangeEnd(keys.Provider(name)), rev))
		} else {
			stray(kvs[0])
			batch = []clientv3.Op{first(key+"\x00", rev)}
		}
		tresp, err := cli.Txn(ctx).Then(batch...).Commit()
		if err != nil {
			return 0, etcdError(err)
		}
		n := len(tresp.Responses) - 1
		if ok {
			visit(name, tresp.Responses[:n])
		}
		kvs = tresp.Responses[n].GetResponseRange().Kvs
	}
	return rev, nil
}
