package main

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"syscall"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/protobuf/proto"

	"github.com/sluice-go/sluice/agent/agentpb"
)

// grpcWindow is the flow-control window the blocking client gives the
// agent, per stream and for the connection: far more than a run's
// answers, so that the agent is never held back and the client sends a
// WINDOW_UPDATE only every half window.
const grpcWindow = 1 << 30

// blockingGRPC is a gRPC client of the agent's Acquire over one HTTP/2
// connection, one call at a time, with blocking system calls as the HTTP
// case's client makes them: each call is one write of its HEADERS and
// DATA frames and blocking reads until its trailers. grpc-go's client
// adds three goroutines and their hand-offs to every call, which a
// client in another language need not pay. It answers the agent's
// SETTINGS and PINGs as HTTP/2 requires, in the write of the next call;
// it does not count its own send window, as a request of a few dozen
// bytes never fills the agent's.
type blockingGRPC struct {
	fd     int
	fr     *http2.Framer
	out    bytes.Buffer // frames for the next write
	hbuf   bytes.Buffer
	henc   *hpack.Encoder
	msg    []byte // the length-prefixed request
	stream uint32
	unsent uint32 // DATA bytes received and not yet given back by a WINDOW_UPDATE
}

// fdReader reads fd with blocking read system calls.
type fdReader int

func (f fdReader) Read(p []byte) (int, error) {
	for {
		n, err := syscall.Read(int(f), p)
		if err == syscall.EINTR {
			continue
		}
		if err == nil && n == 0 {
			return 0, errors.New("agent closed the connection")
		}
		return n, err
	}
}

func dialBlockingGRPC(sock string, req *agentpb.AcquireRequest) (*blockingGRPC, error) {
	fd, err := syscall.Socket(syscall.AF_UNIX, syscall.SOCK_STREAM|syscall.SOCK_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	if err := syscall.Connect(fd, &syscall.SockaddrUnix{Name: sock}); err != nil {
		syscall.Close(fd)
		return nil, err
	}
	body, err := proto.Marshal(req)
	if err != nil {
		syscall.Close(fd)
		return nil, err
	}
	c := &blockingGRPC{fd: fd, stream: 1, msg: binary.BigEndian.AppendUint32([]byte{0}, uint32(len(body)))}
	c.msg = append(c.msg, body...)
	c.henc = hpack.NewEncoder(&c.hbuf)
	c.fr = http2.NewFramer(&c.out, bufio.NewReaderSize(fdReader(fd), 16<<10))
	c.fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	c.out.WriteString(http2.ClientPreface)
	c.fr.WriteSettings(http2.Setting{ID: http2.SettingInitialWindowSize, Val: grpcWindow}, http2.Setting{ID: http2.SettingEnablePush, Val: 0})
	c.fr.WriteWindowUpdate(0, grpcWindow-65535) // the connection's window starts at 65,535
	return c, nil
}

func (c *blockingGRPC) close() { syscall.Close(c.fd) }

// call makes one Acquire and fails unless its status is OK.
func (c *blockingGRPC) call() error {
	id := c.stream
	c.stream += 2
	c.hbuf.Reset()
	for _, f := range [][2]string{
		{":method", "POST"}, {":scheme", "http"}, {":path", agentpb.Agent_Acquire_FullMethodName},
		{":authority", "localhost"}, {"content-type", "application/grpc"}, {"te", "trailers"},
	} {
		c.henc.WriteField(hpack.HeaderField{Name: f[0], Value: f[1]})
	}
	c.fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: c.hbuf.Bytes(), EndHeaders: true})
	c.fr.WriteData(id, true, c.msg)
	if err := c.flush(); err != nil {
		return err
	}
	for {
		f, err := c.fr.ReadFrame()
		if err != nil {
			return err
		}
		done, err := c.handle(f, id)
		if done || err != nil {
			return err
		}
	}
}

// handle takes one frame of the connection; done is whether it ended
// stream id's call.
func (c *blockingGRPC) handle(f http2.Frame, id uint32) (done bool, err error) {
	switch f := f.(type) {
	case *http2.SettingsFrame:
		if !f.IsAck() {
			c.fr.WriteSettingsAck()
		}
	case *http2.PingFrame:
		if !f.IsAck() {
			c.fr.WritePing(true, f.Data)
		}
	case *http2.DataFrame:
		c.unsent += f.Length
		if c.unsent >= grpcWindow/2 { // a stream's own window outlasts its one answer
			c.fr.WriteWindowUpdate(0, c.unsent)
			c.unsent = 0
		}
	case *http2.MetaHeadersFrame:
		if f.StreamID != id || !f.StreamEnded() {
			return false, nil
		}
		if s := f.PseudoValue("status"); s != "" && s != "200" {
			return true, fmt.Errorf("acquire: HTTP status %s", s)
		}
		var status, msg string
		for _, h := range f.RegularFields() {
			switch h.Name {
			case "grpc-status":
				status = h.Value
			case "grpc-message":
				msg = h.Value
			}
		}
		if status != "0" {
			return true, fmt.Errorf("acquire: grpc-status %q: %s", status, msg)
		}
		return true, nil
	case *http2.RSTStreamFrame:
		if f.StreamID == id {
			return true, fmt.Errorf("acquire: stream reset: %v", f.ErrCode)
		}
	case *http2.GoAwayFrame:
		return true, fmt.Errorf("acquire: GOAWAY %v", f.ErrCode)
	}
	return false, nil
}

// flush writes the frames gathered since the last flush in one write.
func (c *blockingGRPC) flush() error {
	b := c.out.Bytes()
	for len(b) > 0 {
		n, err := syscall.Write(c.fd, b)
		if err == syscall.EINTR {
			continue
		}
		if err != nil {
			return err
		}
		b = b[n:]
	}
	c.out.Reset()
	return nil
}
