// Package netcut cuts one process off from a server, for fault tests, in
// one of two ways.
//
// Namespaces runs the process in a network namespace of its own whose only
// way to the server is a veth link; Link.Cut takes the link down, so
// packets vanish the way they do in a real partition: the process's
// connections hang and its requests time out. It needs root and iproute2's
// ip, and uses loopback addresses only.
//
// Proxy puts a TCP proxy in the test between the process and the server;
// Proxy.Cut closes its connections and new ones as they come, so the process
// sees the cut at once. It works anywhere.
//
//	ns, err := netcut.NewNamespaces(t) // deleted with the test
//	if err != nil {
//		t.Logf("no network namespaces (%v): cutting with a proxy", err)
//		px := netcut.StartProxy(t, etcdAddr)
//		...
//	}
//	link, err := ns.Link()
//	addr, err := link.Forward(t, etcdAddr) // what a process inside dials
//	cmd := ns.Command(bin, "-etcd", "http://"+addr)
//	...
//	link.Cut()
//	link.Heal()
package netcut
