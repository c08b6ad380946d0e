package webhooktest

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// ReceiverDir is the receiver's directory, from the module's root.
const ReceiverDir = "e2e/webhookreceiver"

// stampFile, inside node_modules, holds the SHA-256 of the
// package-lock.json that npm ci installed: npm ci removes node_modules
// first and the stamp is written last, so a stamp that matches the lock
// means a complete install of that lock.
const stampFile = ".quill-lock-sha256"

// minNode is the oldest node the receiver runs on (closeAllConnections).
const minNode = 18

// installTimeout bounds npm ci: three small packages, from npm's cache
// once they were fetched.
const installTimeout = 5 * time.Minute

// prepare checks node and npm and installs the receiver's packages when
// node_modules does not match the lock. It returns the receiver's
// directory, or an error saying what is missing or what npm said.
func prepare(t testing.TB) (string, error) {
	if _, err := exec.LookPath("node"); err != nil {
		return "", missing("node")
	}
	if _, err := exec.LookPath("npm"); err != nil {
		return "", missing("npm")
	}
	out, err := exec.Command("node", "--version").Output()
	if err != nil {
		return "", fmt.Errorf("node --version: %w", err)
	}
	if major, ok := nodeMajor(string(out)); !ok || major < minNode {
		return "", fmt.Errorf("node %s is too old: the receiver needs node %d or later (%s)", strings.TrimSpace(string(out)), minNode, Install)
	}
	root, err := moduleRoot()
	if err != nil {
		return "", err
	}
	dir := filepath.Join(root, filepath.FromSlash(ReceiverDir))
	ctx, cancel := context.WithTimeout(context.Background(), installTimeout)
	defer cancel()
	start := time.Now()
	ran, err := installPackages(ctx, dir)
	if err != nil {
		return "", err
	}
	if ran {
		t.Logf("webhooktest: npm ci in %s took %s", dir, time.Since(start).Round(time.Millisecond))
	}
	return dir, nil
}

// nodeMajor reads the major version from node --version ("v20.19.2").
func nodeMajor(s string) (int, bool) {
	s = strings.TrimPrefix(strings.TrimSpace(s), "v")
	major, _, _ := strings.Cut(s, ".")
	n, err := strconv.Atoi(major)
	return n, err == nil
}

// moduleRoot is the nearest directory above the working directory (a
// test's is its package's) that holds go.mod.
func moduleRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", fmt.Errorf("find the module's root: %w", err)
	}
	for {
		if _, err := os.Stat(filepath.Join(dir, "go.mod")); err == nil {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("find the module's root: no go.mod above the working directory")
		}
		dir = parent
	}
}

// installPackages runs npm ci in dir unless node_modules already matches
// package-lock.json, under a file lock: go test runs packages' test
// binaries at once, and two npm ci in one directory would undo each other.
// It reports whether npm ran.
func installPackages(ctx context.Context, dir string) (bool, error) {
	lock, err := os.ReadFile(filepath.Join(dir, "package-lock.json"))
	if err != nil {
		return false, fmt.Errorf("the receiver's lock: %w", err)
	}
	sum := sha256.Sum256(lock)
	want := hex.EncodeToString(sum[:])
	stamp := filepath.Join(dir, "node_modules", stampFile)
	if installed(stamp, want) {
		return false, nil
	}
	unlock, err := lockFile(filepath.Join(dir, ".npm-ci.lock"))
	if err != nil {
		return false, fmt.Errorf("lock the receiver's install: %w", err)
	}
	defer unlock()
	if installed(stamp, want) { // another test binary installed it meanwhile
		return false, nil
	}
	// --prefer-offline: a fresh clone installs from npm's cache without
	// asking the registry; --ignore-scripts: none of the three packages
	// needs an install script.
	cmd := exec.CommandContext(ctx, "npm", "ci", "--no-audit", "--no-fund", "--ignore-scripts", "--prefer-offline", "--loglevel=error")
	cmd.Dir = dir
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	if err := cmd.Run(); err != nil {
		return true, fmt.Errorf("npm ci in %s (is the npm registry reachable, or npm's cache filled?): %w: %s", dir, err, lastLines(out.String(), 5))
	}
	if err := os.WriteFile(stamp, []byte(want+"\n"), 0o644); err != nil {
		return true, fmt.Errorf("after npm ci: %w", err)
	}
	return true, nil
}

func installed(stamp, want string) bool {
	b, err := os.ReadFile(stamp)
	return err == nil && strings.TrimSpace(string(b)) == want
}

func lastLines(s string, n int) string {
	lines := strings.Split(strings.TrimSpace(s), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
