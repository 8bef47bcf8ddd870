package agent

import (
	"context"
	"fmt"
	"net"
	"runtime"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/sluice-go/sluice/agent/agentpb"
	"github.com/sluice-go/sluice/limiter"
)

// ErrorDomain is the domain of the google.rpc.ErrorInfo a gRPC refusal
// carries; its reason is one of the Reason constants.
const ErrorDomain = "sluice.agent"

// GRPCServer returns a gRPC server of the agent's API. A call that came
// over TCP needs the token in its "authorization" metadata ("Bearer
// TOKEN"); one over the Unix socket is let in by the socket's permissions.
// Serve runs one; this is for serving it elsewhere.
func (a *Agent) GRPCServer(opts ...grpc.ServerOption) *grpc.Server {
	base := append([]grpc.ServerOption{grpc.ChainUnaryInterceptor(a.interceptor), streamWorkers()}, staticWindows()...)
	s := grpc.NewServer(append(base, opts...)...)
	agentpb.RegisterAgentServer(s, grpcAgent{a: a})
	return s
}

// streamWorkers runs calls on goroutines kept between calls, one per
// core. grpc-go otherwise starts a goroutine per call, whose small stack
// is grown and copied again on every call. A call that waits holds its
// worker, but no call queues behind it: when every worker is busy,
// grpc-go starts a goroutine for the call as it does without workers.
func streamWorkers() grpc.ServerOption {
	return grpc.NumStreamWorkers(uint32(runtime.GOMAXPROCS(0)))
}

// staticWindows fixes the flow-control windows at 1 MiB, thousands of
// requests of the API's size, so that flow control does not hold a call
// back. grpc-go's default, dynamic windows, measures the connection's
// bandwidth with a PING after data arrives whenever none is out: with
// one call at a time on a connection, that is every call, and each such
// PING comes after a WINDOW_UPDATE and asks the client for an answer;
// frames and wake-ups that a request of a few dozen bytes does not need.
func staticWindows() []grpc.ServerOption {
	const window = 1 << 20
	return []grpc.ServerOption{grpc.StaticStreamWindowSize(window), grpc.StaticConnWindowSize(window)}
}

// interceptor checks the token over TCP and ends the call's wait when
// Serve shuts down, so that GracefulStop does not wait out every caller's
// maxWait.
func (a *Agent) interceptor(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
	if p, ok := peer.FromContext(ctx); ok {
		if _, tcp := p.Addr.(*net.TCPAddr); tcp {
			md, _ := metadata.FromIncomingContext(ctx)
			auth := md.Get("authorization")
			if len(auth) != 1 || !a.authorized(auth[0]) {
				return nil, grpcError(fmt.Errorf("%w: a call over TCP needs the metadata 'authorization: Bearer TOKEN'", ErrUnauthenticated))
			}
		}
	}
	if d := a.grpcDrain.Load(); d != nil {
		var cancel context.CancelFunc
		ctx, cancel = context.WithCancel(ctx)
		defer cancel()
		defer context.AfterFunc(*d, cancel)()
	}
	return h(ctx, req)
}

func grpcError(err error) error {
	r := Reason(err)
	st := status.New(outcomes[r].grpc, err.Error())
	if d, e := st.WithDetails(&errdetails.ErrorInfo{Reason: r, Domain: ErrorDomain}); e == nil {
		st = d
	}
	return st.Err()
}

type grpcAgent struct {
	agentpb.UnimplementedAgentServer
	a *Agent
}

func (g grpcAgent) request(in *agentpb.AcquireRequest) (Request, error) {
	if in.Provider == "" {
		return Request{}, fmt.Errorf("%w: provider is required", ErrBadRequest)
	}
	w, err := waitOf(in.MaxWaitMs, g.a.cfg.MaxWait)
	if err != nil {
		return Request{}, err
	}
	cost, err := amounts(in.Cost)
	if err != nil {
		return Request{}, err
	}
	if err := checkCaller(in.Caller); err != nil {
		return Request{}, err
	}
	if err := checkClass(in.Class); err != nil {
		return Request{}, err
	}
	return Request{Provider: in.Provider, Caller: in.Caller, Cost: cost, MaxWait: w, Class: in.Class}, nil
}

func (g grpcAgent) acquire(ctx context.Context, in *agentpb.AcquireRequest, op func(context.Context, Request) (Granted, error)) (*agentpb.AcquireResponse, error) {
	req, err := g.request(in)
	if err != nil {
		return nil, grpcError(err)
	}
	gr, err := op(ctx, req)
	if err != nil {
		return nil, grpcError(err)
	}
	if ctx.Err() != nil {
		// The caller went away as it was granted: give it back.
		g.a.Cancel(ctx, gr.ID, req.Caller)
		return nil, grpcError(fmt.Errorf("%w: %w", limiter.ErrCanceled, ctx.Err()))
	}
	return &agentpb.AcquireResponse{Grant: gr.ID, Cost: gr.Cost}, nil
}

func (g grpcAgent) Acquire(ctx context.Context, in *agentpb.AcquireRequest) (*agentpb.AcquireResponse, error) {
	return g.acquire(ctx, in, g.a.Acquire)
}

func (g grpcAgent) TryAcquire(ctx context.Context, in *agentpb.AcquireRequest) (*agentpb.AcquireResponse, error) {
	return g.acquire(ctx, in, g.a.TryAcquire)
}

func (g grpcAgent) Reserve(ctx context.Context, in *agentpb.AcquireRequest) (*agentpb.ReserveResponse, error) {
	req, err := g.request(in)
	if err != nil {
		return nil, grpcError(err)
	}
	gr, err := g.a.Reserve(ctx, req)
	if err != nil {
		return nil, grpcError(err)
	}
	return &agentpb.ReserveResponse{Reservation: gr.ID, DelayMs: float64(gr.Delay) / float64(time.Millisecond), Cost: gr.Cost}, nil
}

func (g grpcAgent) Cancel(ctx context.Context, in *agentpb.CancelRequest) (*agentpb.CancelResponse, error) {
	if err := checkID(in.Id, in.Caller); err != nil {
		return nil, grpcError(err)
	}
	if err := g.a.Cancel(ctx, in.Id, in.Caller); err != nil {
		return nil, grpcError(err)
	}
	return &agentpb.CancelResponse{}, nil
}

func (g grpcAgent) Settle(ctx context.Context, in *agentpb.SettleRequest) (*agentpb.SettleResponse, error) {
	if err := checkID(in.Id, in.Caller); err != nil {
		return nil, grpcError(err)
	}
	cost, err := amounts(in.Cost)
	if err != nil {
		return nil, grpcError(err)
	}
	if err := g.a.Settle(ctx, in.Id, in.Caller, cost); err != nil {
		return nil, grpcError(err)
	}
	return &agentpb.SettleResponse{}, nil
}

func checkID(id, caller string) error {
	if id == "" || len(id) > 64 {
		return fmt.Errorf("%w: id is required, at most 64 characters", ErrBadRequest)
	}
	return checkCaller(caller)
}
