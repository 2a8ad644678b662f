// Package loop attaches files to loop devices with losetup and finds those
// attachments again by backing file, so a restarted driver needs no state of
// its own to know which loop device serves which volume.
package loop

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
)

// Find returns the loop device backed by file, or "" when none is.
func Find(ctx context.Context, file string) (string, error) {
	out, err := run(ctx, "losetup", "--associated", file, "--noheadings", "--output", "NAME")
	if err != nil {
		return "", err
	}
	// losetup matches by device and inode, so a volume file that was
	// deleted and made again under the same name is not mistaken for the
	// old one; the first line wins when an attachment was duplicated.
	for _, line := range strings.Split(out, "\n") {
		if dev := strings.TrimSpace(line); dev != "" {
			return dev, nil
		}
	}
	return "", nil
}

// FindAll returns every loop device backed by file.
func FindAll(ctx context.Context, file string) ([]string, error) {
	out, err := run(ctx, "losetup", "--associated", file, "--noheadings", "--output", "NAME")
	if err != nil {
		return nil, err
	}
	var devs []string
	for _, line := range strings.Split(out, "\n") {
		if dev := strings.TrimSpace(line); dev != "" {
			devs = append(devs, dev)
		}
	}
	return devs, nil
}

// Attach returns the loop device backed by file, attaching one with direct
// I/O when there is none, so calling it again is harmless.
func Attach(ctx context.Context, file string) (string, error) {
	if dev, err := Find(ctx, file); err != nil || dev != "" {
		return dev, err
	}
	out, err := run(ctx, "losetup", "--find", "--show", "--direct-io=on", file)
	if err != nil {
		return "", err
	}
	dev := strings.TrimSpace(out)
	if dev == "" {
		return "", fmt.Errorf("losetup printed no device for %s", file)
	}
	return dev, nil
}

// Detach detaches every loop device backed by file; none is fine.
func Detach(ctx context.Context, file string) error {
	devs, err := FindAll(ctx, file)
	if err != nil {
		return err
	}
	var errs []error
	for _, dev := range devs {
		if _, err := run(ctx, "losetup", "--detach", dev); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// Refresh makes dev pick up its backing file's new size.
func Refresh(ctx context.Context, dev string) error {
	_, err := run(ctx, "losetup", "--set-capacity", dev)
	return err
}

// DirectIO reports whether dev does direct I/O on its backing file; the
// kernel silently falls back to buffered I/O when alignment forbids it.
func DirectIO(dev string) (bool, error) {
	data, err := os.ReadFile(filepath.Join("/sys/block", filepath.Base(dev), "loop", "dio"))
	if err != nil {
		return false, fmt.Errorf("reading direct I/O state of %s: %w", dev, err)
	}
	return strings.TrimSpace(string(data)) == "1", nil
}

func run(ctx context.Context, name string, args ...string) (string, error) {
	var stdout, stderr bytes.Buffer
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Stdout = &stdout
	cmd.Stderr = &stderr
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("%s %s: %w: %s", name, strings.Join(args, " "), err, strings.TrimSpace(stderr.String()))
	}
	return stdout.String(), nil
}
