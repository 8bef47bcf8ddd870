package main

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"github.com/sluice-go/sluice/internal/ledger"
	"github.com/sluice-go/sluice/internal/schema"
)

// Access control of the embedded etcd.
//
// The embedded etcd is closed by default: etcd's own authentication is on,
// with three users whose passwords configd generates at the first start
// and keeps in <data-dir>/credentials/<user>, files only configd's OS user
// may read (0600, in a 0700 directory):
//
//   - root: configd itself, everything;
//   - instance: the instances — read the providers and the leader keys,
//     write records under each provider's instances/ (granted as each
//     provider is created), nothing else: no config, no shares, no
//     election, no history;
//   - reader: operators' tools (configd status --etcd-endpoints), read
//     only.
//
// Authentication rather than a Unix socket: every etcd client, in any
// language, speaks it over the same loopback TCP the default setup already
// uses, and it separates what instances may write from what configd may,
// which a socket's file permissions cannot. A local user who cannot read
// the credential files cannot write anything; one who can read only the
// instance's can write only instance records (docs/security.md).
const (
	credentialsDir = "credentials"
	rootUser       = "root"
	instanceUser   = "instance"
	readerUser     = "reader"
	instanceRole   = "sluice-instance"
	readerRole     = "sluice-reader"
)

// credentialsFile returns the file of user's password under dataDir.
func credentialsFile(dataDir, user string) string {
	return filepath.Join(dataDir, credentialsDir, user)
}

// readPassword reads user's password from its credentials file under
// dataDir.
func readPassword(dataDir, user string) (string, error) {
	b, err := os.ReadFile(credentialsFile(dataDir, user))
	if err != nil {
		return "", err
	}
	return strings.TrimSpace(string(b)), nil
}

// newPassword returns 32 random bytes, base64url.
func newPassword() (string, error) {
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		return "", err
	}
	return base64.RawURLEncoding.EncodeToString(b), nil
}

// writePassword writes user's password into its credentials file, readable
// by this OS user only, replacing it atomically.
func writePassword(dataDir, user, pw string) error {
	dir := filepath.Join(dataDir, credentialsDir)
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	if err := os.Chmod(dir, 0o700); err != nil {
		return err
	}
	tmp, err := os.CreateTemp(dir, "."+user+".*")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.WriteString(pw + "\n"); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), credentialsFile(dataDir, user))
}

// closeAccess sets up the users, roles and permissions above on an etcd
// whose authentication is still off (reached by cli, unauthenticated),
// writes the passwords, and turns authentication on. It can be run again
// after a crash half-way: existing users get the passwords of their files.
func closeAccess(ctx context.Context, cli *clientv3.Client, dataDir string, keys schema.Keys) error {
	for _, user := range []string{rootUser, instanceUser, readerUser} {
		pw, err := readPassword(dataDir, user)
		if errors.Is(err, fs.ErrNotExist) {
			if pw, err = newPassword(); err == nil {
				err = writePassword(dataDir, user, pw)
			}
		}
		if err != nil {
			return fmt.Errorf("credentials of %s: %w", user, err)
		}
		if _, err := cli.UserAdd(ctx, user, pw); errors.Is(err, rpctypes.ErrUserAlreadyExist) {
			_, err = cli.UserChangePassword(ctx, user, pw)
		} else if err != nil {
			return fmt.Errorf("etcd user %s: %w", user, err)
		}
	}
	grants := []struct {
		role, user, key string
		perm            clientv3.PermissionType
	}{
		{instanceRole, instanceUser, keys.Providers(), clientv3.PermissionType(clientv3.PermRead)},
		{instanceRole, instanceUser, keys.Election(), clientv3.PermissionType(clientv3.PermRead)},
		{readerRole, readerUser, keys.Prefix(), clientv3.PermissionType(clientv3.PermRead)},
	}
	for _, g := range grants {
		if _, err := cli.RoleAdd(ctx, g.role); err != nil && !errors.Is(err, rpctypes.ErrRoleAlreadyExist) {
			return fmt.Errorf("etcd role %s: %w", g.role, err)
		}
		if _, err := cli.RoleGrantPermission(ctx, g.role, g.key, clientv3.GetPrefixRangeEnd(g.key), g.perm); err != nil {
			return fmt.Errorf("etcd role %s on %s: %w", g.role, g.key, err)
		}
		if _, err := cli.UserGrantRole(ctx, g.user, g.role); err != nil {
			return fmt.Errorf("etcd user %s, role %s: %w", g.user, g.role, err)
		}
	}
	if _, err := cli.UserGrantRole(ctx, rootUser, rootUser); err != nil {
		return fmt.Errorf("etcd user root: %w", err)
	}
	if _, err := cli.AuthEnable(ctx); err != nil {
		return fmt.Errorf("enabling etcd authentication: %w", err)
	}
	return nil
}

// grantProvider lets the instance user write the instance records, the
// even-split confirmations, of a budget lane the counters and of a
// ledger its releases, of provider name: a release only lowers, so a
// forged one takes room away and never adds any. Not the ledger's grants
// or head: without configd, instances stand in for its rounds only where
// an operator grants them the whole ledger. Granted when the provider is
// created, and again for every provider when configd starts; granting
// twice is harmless.
func grantProvider(ctx context.Context, cli *clientv3.Client, keys schema.Keys, name string) error {
	releases := ledger.Keys(keys.Ledger(name)).AllReleases()
	for _, key := range []string{keys.Instances(name), keys.Even(name), keys.Budgets(name), releases} {
		if _, err := cli.RoleGrantPermission(ctx, instanceRole, key, clientv3.GetPrefixRangeEnd(key), clientv3.PermissionType(clientv3.PermReadWrite)); err != nil {
			return fmt.Errorf("letting instances of %q write their records: %w", name, err)
		}
	}
	// Its ledger lives beside the providers, outside what the role reads
	// from the first start: it is granted here, for each provider, so that
	// an install from before the ledger reads it too.
	key := keys.Ledger(name)
	if _, err := cli.RoleGrantPermission(ctx, instanceRole, key, clientv3.GetPrefixRangeEnd(key), clientv3.PermissionType(clientv3.PermRead)); err != nil {
		return fmt.Errorf("letting instances of %q read its ledger: %w", name, err)
	}
	return nil
}

// grantProviders grants every provider that has a config.
func grantProviders(ctx context.Context, cli *clientv3.Client, keys schema.Keys) error {
	resp, err := cli.Get(ctx, keys.Providers(), clientv3.WithPrefix(), clientv3.WithKeysOnly())
	if err != nil {
		return err
	}
	for _, kv := range resp.Kvs {
		k, err := keys.Parse(string(kv.Key))
		if err != nil || k.Kind != schema.KindConfig {
			continue
		}
		if err := grantProvider(ctx, cli, keys, k.Provider); err != nil {
			return err
		}
	}
	return nil
}
