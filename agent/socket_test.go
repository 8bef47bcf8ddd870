//go:build linux

package agent

import (
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
)

// TestSocketGroup: with SocketGroup (--socket-group) both sockets belong
// to that group, with mode 0660, so that its members may call the agent;
// a group that does not exist is refused at Listen and leaves no socket.
func TestSocketGroup(t *testing.T) {
	gid := -1
	groups, _ := os.Getgroups()
	for _, g := range groups {
		if g != os.Getegid() {
			gid = g
		}
	}
	if gid < 0 && os.Geteuid() == 0 {
		gid = os.Getegid() + 4242 // root may give a file any group
	}
	if gid < 0 {
		t.Skip("this process belongs to no group but its own: none to give the sockets")
	}
	cfg := conf(llm)
	cfg.SocketGroup = strconv.Itoa(gid)
	s := serve(t, cfg)
	for _, name := range []string{"a.sock", "g.sock"} {
		fi, err := os.Stat(filepath.Join(s.dir, name))
		if err != nil {
			t.Fatal(err)
		}
		st, ok := fi.Sys().(*syscall.Stat_t)
		if !ok {
			t.Fatalf("%s: no stat_t", name)
		}
		if int(st.Gid) != gid || fi.Mode().Perm() != 0o660 {
			t.Errorf("%s: mode %v, group %d; want 0660 and group %d", name, fi.Mode(), st.Gid, gid)
		}
	}
	if a := s.post(t, "/v1/acquire", `{"provider":"llm"}`); a.Status != 200 {
		t.Errorf("acquire on the group's socket: %+v", a)
	}

	cfg = conf(llm)
	cfg.Socket, cfg.GRPCSocket, cfg.SocketGroup = filepath.Join(t.TempDir(), "x.sock"), "", "sluice-no-such-group"
	b, err := New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	defer b.Close()
	if ls, err := b.Listen(); err == nil {
		ls.close()
		t.Error("Listen with a group that does not exist: no error")
	} else if !strings.Contains(err.Error(), "socket group") {
		t.Errorf("Listen with a group that does not exist: %v; want it to name the socket group", err)
	}
	for _, p := range []string{cfg.Socket, cfg.Socket + ".new"} {
		if _, err := os.Lstat(p); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s after a refused Listen: %v; want nothing there", p, err)
		}
	}
}
