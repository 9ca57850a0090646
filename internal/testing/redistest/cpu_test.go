package redistest

import "testing"

func TestServerCPU(t *testing.T) {
	cpu, err := ServerCPU("# CPU\r\nused_cpu_sys:1.25\r\nused_cpu_user:2.5\r\nused_cpu_sys_children:9\r\n")
	if err != nil || cpu != 3.75 {
		t.Fatalf("ServerCPU = %v, %v; want 3.75", cpu, err)
	}
	for _, bad := range []string{"# CPU\r\nused_cpu_sys:1\r\n", "used_cpu_sys:1\r\nused_cpu_user:x\r\n", ""} {
		if _, err := ServerCPU(bad); err == nil {
			t.Errorf("ServerCPU(%q): no error", bad)
		}
	}
}
