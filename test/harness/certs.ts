// Test certificates made with openssl: a CA, and a server and a client certificate it signs (the
// server's for IP 127.0.0.1 and the name localhost: clients were seen checking either).
import { execFileSync } from "node:child_process";
import { writeFileSync } from "node:fs";
import { join } from "node:path";

/** Writes ca.pem/ca.key, server.pem/server.key and client.pem/client.key into `dir`. */
export function makeTestCerts(dir: string): void {
  const ssl = (...args: string[]) => execFileSync("openssl", args, { cwd: dir, stdio: "pipe" });
  ssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=ooze-test-ca", "-keyout", "ca.key", "-out", "ca.pem");
  writeFileSync(join(dir, "server.ext"), "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n");
  writeFileSync(join(dir, "client.ext"), "extendedKeyUsage=clientAuth\n");
  for (const who of ["server", "client"]) {
    ssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", `/CN=ooze-test-${who}`, "-keyout", `${who}.key`, "-out", `${who}.csr`);
    ssl("x509", "-req", "-in", `${who}.csr`, "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial", "-days", "1", "-extfile", `${who}.ext`, "-out", `${who}.pem`);
  }
}
