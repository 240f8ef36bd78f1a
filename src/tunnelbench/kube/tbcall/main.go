// tbcall: one VPN client pod's request loop for many_clients on Kubernetes (kube/fleet.py).
//
// It waits at the start barrier, then calls the REST service as the namespace generator does
// (workloads/many_clients.py): an empty GET every interval, a new TCP connection per call, a call slower than
// timeout fails. Every line it prints is one JSON object (kube/fleet.py parse_pod_log):
//
//	{"ev":"connected","ms":M}   the first HTTP answer through the tunnel, M ms after the program started
//	{"ev":"go","t0":T}          the barrier opened: the measured window starts at T (Unix seconds)
//	{"s":S,"lag":L,"ms":R,"st":X} one call: scheduled S s after T, started L ms late, took R ms, X = 1 ok,
//	                            0 error (connection refused/reset, not 200), -1 timeout
//	{"ev":"end","calls":K}
//
// Barrier: GET /tb-go?c=ID every poll seconds until it answers 200 with T in its body (the product writes the
// file when every client has asked once, the server's log of the asks naming each ID, or when its wait for them
// ran out: a client that never got through then has no "go" line, and the product counts its calls as failed).
package main

import (
	"bytes"
	"errors"
	"flag"
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"time"
)

func get(addr, host, path string, timeout time.Duration) (int, []byte, error) {
	deadline := time.Now().Add(timeout)
	c, err := net.DialTimeout("tcp", addr, timeout)
	if err != nil {
		return 0, nil, err
	}
	defer c.Close()
	if err := c.SetDeadline(deadline); err != nil {
		return 0, nil, err
	}
	req := "GET " + path + " HTTP/1.1\r\nHost: " + host + "\r\nUser-Agent: tunnelbench\r\nAccept: */*\r\nConnection: close\r\n\r\n"
	if _, err := c.Write([]byte(req)); err != nil {
		return 0, nil, err
	}
	var buf bytes.Buffer
	tmp := make([]byte, 4096)
	for {
		n, err := c.Read(tmp)
		buf.Write(tmp[:n])
		if err != nil {
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				return 0, nil, err
			}
			break // EOF: the server closed (Connection: close)
		}
	}
	b := buf.Bytes()
	status := 0
	if len(b) >= 12 && bytes.HasPrefix(b, []byte("HTTP/1.")) {
		status, _ = strconv.Atoi(string(b[9:12]))
	}
	body := b
	if i := bytes.Index(b, []byte("\r\n\r\n")); i >= 0 {
		body = b[i+4:]
	}
	return status, body, nil
}

func isTimeout(err error) bool {
	var ne net.Error
	return errors.As(err, &ne) && ne.Timeout()
}

func main() {
	server := flag.String("server", "", "the REST service's address (the server's tunnel address)")
	port := flag.Int("port", 8082, "its port")
	id := flag.Int("id", 0, "this client's number, 0..n-1")
	n := flag.Int("n", 1, "clients in the run")
	interval := flag.Float64("interval", 0.25, "seconds between calls")
	duration := flag.Float64("duration", 15, "seconds of calling")
	timeout := flag.Float64("timeout", 10, "a call slower than this fails (s)")
	poll := flag.Float64("poll", 0.2, "barrier poll interval (s)")
	wait := flag.Float64("wait", 600, "give up when the barrier has not opened after this long (s)")
	flag.Parse()
	start := time.Now()
	addr := net.JoinHostPort(*server, strconv.Itoa(*port))
	to := time.Duration(*timeout * float64(time.Second))
	connected := false
	var t0 float64
	for {
		// as long as a call may take: under the seed's delays (1000 ms each way: a new connection and its GET
		// take two round trips, 4 s) a shorter wait would never see the barrier through a working tunnel
		status, body, err := get(addr, *server, fmt.Sprintf("/tb-go?c=%d", *id), to)
		if err == nil && status > 0 && !connected {
			connected = true
			fmt.Printf("{\"ev\":\"connected\",\"ms\":%.3f}\n", float64(time.Since(start).Microseconds())/1000)
		}
		if status == 200 {
			if v, perr := strconv.ParseFloat(strings.TrimSpace(string(body)), 64); perr == nil {
				t0 = v
				break
			}
		}
		if time.Since(start).Seconds() > *wait {
			fmt.Printf("{\"ev\":\"barrier-timeout\",\"connected\":%t}\n", connected)
			os.Exit(3)
		}
		time.Sleep(time.Duration(*poll * float64(time.Second)))
	}
	fmt.Printf("{\"ev\":\"go\",\"t0\":%.6f}\n", t0)
	unix := func() float64 { return float64(time.Now().UnixNano()) / 1e9 }
	first := t0 + *interval*float64(*id)/float64(*n)
	calls := 0
	for k := 0; ; {
		sched := first + float64(k)*(*interval)
		if sched-t0 >= *duration {
			break
		}
		if now := unix(); sched > now {
			time.Sleep(time.Duration((sched - now) * float64(time.Second)))
		}
		s := unix()
		status, body, err := get(addr, *server, "/api", to)
		e := unix()
		st := 0
		if err != nil && isTimeout(err) {
			st = -1
		} else if err == nil && status == 200 && bytes.HasSuffix(body, []byte("OK\n")) {
			st = 1
		}
		fmt.Printf("{\"s\":%.4f,\"lag\":%.3f,\"ms\":%.3f,\"st\":%d}\n", sched-t0, (s-sched)*1000, (e-s)*1000, st)
		calls++
		k++
		if e > sched+*interval { // a slow call: the next one starts when this one is done
			if m := int((e-first)/(*interval)) + 1; m > k {
				k = m
			}
		}
	}
	fmt.Printf("{\"ev\":\"end\",\"calls\":%d}\n", calls)
}
