package main

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"strings"
)

// ErrTokenFileExposed: the admin token file lets other users read or
// replace the token. It comes wrapped in a *ConfigError, whose message
// names the flag and file, so it has no "configd:" prefix of its own.
var ErrTokenFileExposed = errors.New("the admin token file is open to other users")

// minTokenLength is the shortest admin token serve accepts.
const minTokenLength = 16

// readTokenFile reads the admin token from path and checks who else can
// read or write it, as ssh checks a private key's file.
//
// A file others can read or write, or its group can write, is refused
// (a *ConfigError wrapping ErrTokenFileExposed) unless allowExposed
// (--insecure-token-file), which logs a warning instead: any local user
// could read the token and write through the API, or replace it. Refusing
// is ssh's answer to an unprotected key, and the fix is one chmod; the
// flag is for where the bits mean little, such as a container that runs
// nothing else.
//
// A file its group can read is how a root-owned secret is handed to a
// service's group (root:configd 0640; Kubernetes' fsGroup with a secret's
// defaultMode 0440), so it passes quietly when that group is one of
// configd's, and with a warning when it is not.
func readTokenFile(path string, allowExposed bool, log *slog.Logger) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("--admin-token-file: %w", err)
	}
	defer f.Close()
	fi, err := f.Stat() // the file read, not whatever path names later
	if err != nil {
		return nil, fmt.Errorf("--admin-token-file: %w", err)
	}
	b, err := io.ReadAll(f)
	if err != nil {
		return nil, fmt.Errorf("--admin-token-file: %w", err)
	}
	token := []byte(strings.TrimSpace(string(b)))
	if len(token) < minTokenLength {
		return nil, &ConfigError{"admin-token-file", path, fmt.Errorf("the token must be at least %d characters", minTokenLength)}
	}
	ours, known := groupIsOurs(fi)
	if !known {
		return token, nil // no Unix permissions to check
	}
	perm := fi.Mode().Perm()
	exposed, foreignGroup := modeExposure(perm, ours)
	mode := fmt.Sprintf("%04o", perm)
	switch {
	case len(exposed) > 0 && !allowExposed:
		return nil, &ConfigError{"admin-token-file", path, fmt.Errorf("%w: mode %s (%s); chmod 600 the file "+
			"(640 to share it with configd's group), or pass --insecure-token-file to accept it",
			ErrTokenFileExposed, mode, strings.Join(exposed, ", "))}
	case len(exposed) > 0:
		log.Warn("admin token file is open to other users; accepted because of --insecure-token-file",
			"file", path, "mode", mode, "exposure", strings.Join(exposed, ", "))
	case foreignGroup:
		log.Warn("admin token file is readable by its group, which configd's user is not in",
			"file", path, "mode", mode)
	}
	return token, nil
}

// modeExposure says what a token file's permissions let others do: the
// grants that make it refused (exposed), and whether a group that is not
// configd's can read it (a warning).
func modeExposure(perm fs.FileMode, groupOurs bool) (exposed []string, foreignGroup bool) {
	if perm&0o004 != 0 {
		exposed = append(exposed, "others can read it")
	}
	if perm&0o002 != 0 {
		exposed = append(exposed, "others can write it")
	}
	if perm&0o020 != 0 {
		exposed = append(exposed, "its group can write it")
	}
	return exposed, perm&0o040 != 0 && !groupOurs
}
