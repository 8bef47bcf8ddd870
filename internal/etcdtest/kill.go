package etcdtest

import (
	"context"
	"sync"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// rpcs tracks a member's client RPCs in progress (through gRPC
// interceptors) so that Kill can end them at once.
type rpcs struct {
	mu      sync.Mutex
	killed  bool
	next    int
	cancels map[int]context.CancelFunc
}

func newRPCs() *rpcs { return &rpcs{cancels: map[int]context.CancelFunc{}} }

// errKilled is what clients get from a killed member.
var errKilled = status.Error(codes.Unavailable, "etcdtest: member killed")

func (r *rpcs) serverOptions() []grpc.ServerOption {
	return []grpc.ServerOption{
		grpc.ChainUnaryInterceptor(func(ctx context.Context, req any, _ *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
			ctx, end, err := r.begin(ctx)
			if err != nil {
				return nil, err
			}
			defer end()
			resp, err := handler(ctx, req)
			if r.isKilled() {
				return nil, errKilled
			}
			return resp, err
		}),
		grpc.ChainStreamInterceptor(func(srv any, ss grpc.ServerStream, _ *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
			ctx, end, err := r.begin(ss.Context())
			if err != nil {
				return err
			}
			defer end()
			err = handler(srv, ctxStream{ServerStream: ss, ctx: ctx})
			if r.isKilled() {
				return errKilled
			}
			return err
		}),
	}
}

// begin registers an RPC; end unregisters it. It fails once killed.
func (r *rpcs) begin(ctx context.Context) (_ context.Context, end func(), _ error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.killed {
		return nil, nil, errKilled
	}
	ctx, cancel := context.WithCancel(ctx)
	id := r.next
	r.next++
	r.cancels[id] = cancel
	return ctx, func() {
		r.mu.Lock()
		delete(r.cancels, id)
		r.mu.Unlock()
		cancel()
	}, nil
}

func (r *rpcs) isKilled() bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.killed
}

// kill cancels every RPC in progress, refuses new ones, and returns how
// many it cancelled.
func (r *rpcs) kill() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.killed = true
	for _, cancel := range r.cancels {
		cancel()
	}
	return len(r.cancels)
}

// ctxStream is a server stream whose context Kill can cancel: etcd's watch
// and lease keep-alive handlers return when it is done.
type ctxStream struct {
	grpc.ServerStream
	ctx context.Context
}

func (s ctxStream) Context() context.Context { return s.ctx }
