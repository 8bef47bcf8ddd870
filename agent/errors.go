package agent

import (
	"context"
	"errors"
	"net/http"

	"google.golang.org/grpc/codes"

	"github.com/sluice-go/sluice/limiter"
	"github.com/sluice-go/sluice/limiter/cluster"
)

// Sentinel errors of the agent's own; refusals by a limit wrap the
// limiter's (limiter.ErrTimeout, ErrNoQuota, ErrCanceled, ErrClosed,
// ErrInvalid). Use errors.Is.
var (
	// ErrBadRequest means a request could not be read: malformed JSON,
	// an unknown field, a value out of range. It changed nothing.
	ErrBadRequest = errors.New("agent: bad request")
	// ErrUnauthenticated means a request over TCP lacked the token.
	ErrUnauthenticated = errors.New("agent: missing or wrong token")
	// ErrProviderNotAllowed means the provider is neither configured nor
	// allowed (Config.Allow).
	ErrProviderNotAllowed = errors.New("agent: provider not allowed")
	// ErrTooManyProviders means the agent holds Config.MaxProviders
	// providers already.
	ErrTooManyProviders = errors.New("agent: too many providers")
	// ErrUnknownGrant means no grant or reservation has that id: it was
	// settled or cancelled already, expired (Config.GrantTTL), or is not
	// this agent's.
	ErrUnknownGrant = errors.New("agent: unknown or expired grant")
	// ErrNotYetValid means a reservation was settled before it became
	// valid.
	ErrNotYetValid = errors.New("agent: reservation not yet valid")
	// ErrClosed means the agent is shutting down.
	ErrClosed = errors.New("agent: closed")
)

// Reasons name a refusal on the wire: the "error" field of an HTTP/JSON
// answer, the google.rpc.ErrorInfo reason of a gRPC status.
const (
	ReasonTimeout            = "TIMEOUT"
	ReasonNoQuota            = "NO_QUOTA"
	ReasonCanceled           = "CANCELED"
	ReasonClosed             = "CLOSED"
	ReasonInvalid            = "INVALID"
	ReasonBadRequest         = "BAD_REQUEST"
	ReasonUnauthenticated    = "UNAUTHENTICATED"
	ReasonProviderNotAllowed = "PROVIDER_NOT_ALLOWED"
	ReasonTooManyProviders   = "TOO_MANY_PROVIDERS"
	ReasonUnknownGrant       = "UNKNOWN_GRANT"
	ReasonNotYetValid        = "NOT_YET_VALID"
	ReasonTooLarge           = "TOO_LARGE"
	ReasonNotFound           = "NOT_FOUND"
	ReasonMethodNotAllowed   = "METHOD_NOT_ALLOWED"
	ReasonInternal           = "INTERNAL"
)

// StatusClientClosed is the HTTP status of a request whose caller went
// away while it waited (nginx's 499): nobody reads it.
const StatusClientClosed = 499

// outcome is how one request ended, as status and metrics count it.
type outcome struct {
	reason string
	http   int
	grpc   codes.Code
}

var outcomes = map[string]outcome{
	"":                       {"", http.StatusOK, codes.OK},
	ReasonTimeout:            {ReasonTimeout, http.StatusTooManyRequests, codes.ResourceExhausted},
	ReasonNoQuota:            {ReasonNoQuota, http.StatusTooManyRequests, codes.ResourceExhausted},
	ReasonCanceled:           {ReasonCanceled, StatusClientClosed, codes.Canceled},
	ReasonClosed:             {ReasonClosed, http.StatusServiceUnavailable, codes.Unavailable},
	ReasonInvalid:            {ReasonInvalid, http.StatusBadRequest, codes.InvalidArgument},
	ReasonBadRequest:         {ReasonBadRequest, http.StatusBadRequest, codes.InvalidArgument},
	ReasonUnauthenticated:    {ReasonUnauthenticated, http.StatusUnauthorized, codes.Unauthenticated},
	ReasonProviderNotAllowed: {ReasonProviderNotAllowed, http.StatusForbidden, codes.PermissionDenied},
	ReasonTooManyProviders:   {ReasonTooManyProviders, http.StatusServiceUnavailable, codes.ResourceExhausted},
	ReasonUnknownGrant:       {ReasonUnknownGrant, http.StatusNotFound, codes.NotFound},
	ReasonNotYetValid:        {ReasonNotYetValid, http.StatusConflict, codes.FailedPrecondition},
	ReasonTooLarge:           {ReasonTooLarge, http.StatusRequestEntityTooLarge, codes.InvalidArgument},
	ReasonNotFound:           {ReasonNotFound, http.StatusNotFound, codes.Unimplemented},
	ReasonMethodNotAllowed:   {ReasonMethodNotAllowed, http.StatusMethodNotAllowed, codes.Unimplemented},
	ReasonInternal:           {ReasonInternal, http.StatusInternalServerError, codes.Internal},
}

// Reason returns the wire name of err's refusal ("" for nil). The order
// matters: a wait that ran out of quota wraps both ErrTimeout and
// ErrNoQuota, and says NO_QUOTA, the more telling.
func Reason(err error) string {
	switch {
	case err == nil:
		return ""
	case errors.Is(err, ErrBadRequest):
		return ReasonBadRequest
	case errors.Is(err, ErrUnauthenticated):
		return ReasonUnauthenticated
	case errors.Is(err, ErrProviderNotAllowed):
		return ReasonProviderNotAllowed
	case errors.Is(err, ErrTooManyProviders):
		return ReasonTooManyProviders
	case errors.Is(err, ErrUnknownGrant):
		return ReasonUnknownGrant
	case errors.Is(err, ErrNotYetValid):
		return ReasonNotYetValid
	case errors.Is(err, ErrClosed), errors.Is(err, limiter.ErrClosed), errors.Is(err, cluster.ErrClosed):
		return ReasonClosed
	case errors.Is(err, limiter.ErrNoQuota):
		return ReasonNoQuota
	case errors.Is(err, limiter.ErrTimeout), errors.Is(err, context.DeadlineExceeded):
		return ReasonTimeout
	case errors.Is(err, limiter.ErrCanceled), errors.Is(err, context.Canceled):
		return ReasonCanceled
	case errors.Is(err, limiter.ErrInvalid):
		return ReasonInvalid
	}
	return ReasonInternal
}

func outcomeOf(err error) outcome { return outcomes[Reason(err)] }
