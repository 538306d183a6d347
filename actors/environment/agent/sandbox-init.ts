// The first program inside an episode's sandbox (run by bubblewrap, as the sandbox's uid, after the
// resource limits are set): a Perl script, because perl-base is Essential on Debian (always there,
// ~9 ms to start where node takes ~70). It
// - listens on 127.0.0.1:PORT inside the sandbox's network namespace and forwards each connection to
//   the episode's gateway socket (a Unix socket bind-mounted at SOCK): the one endpoint the agent
//   can reach (none with `network: host`, SOCK empty);
// - starts the agent command (execvp: PATH lookup) once it listens, so the first request never races it;
// - speaks to ooze over fd 3 (a socketpair ooze holds): "TERM" sends SIGTERM to every process of the
//   sandbox, EOF (ooze died) SIGKILLs them; it answers "exit N", "signal N" or "nostart REASON" when
//   the agent ends, then SIGKILLs whatever the agent left (daemons, setsid, double forks) and exits.
// Argv: SOCK PORT -- COMMAND ARGS...

/** The script, for `perl -e`. */
export const SANDBOX_INIT = String.raw`
use strict;
# Linux's constants, written out: loading Socket, Fcntl or POSIX would triple the start-up time (x86-64 and arm64 values).
sub AF_UNIX() { 1 } sub AF_INET() { 2 } sub SOCK_STREAM() { 1 } sub SOL_SOCKET() { 1 } sub SO_REUSEADDR() { 2 }
sub F_SETFD() { 2 } sub FD_CLOEXEC() { 1 } sub F_GETFL() { 3 } sub F_SETFL() { 4 } sub O_NONBLOCK() { 2048 } sub WNOHANG() { 1 } sub EAGAIN() { 11 }
my ($sock, $port, $dash) = splice(@ARGV, 0, 3);
die "ooze sandbox init: usage SOCK PORT -- COMMAND ARGS\n" unless defined $dash && $dash eq '--' && @ARGV;
open(my $ctl, '+<&=', 3) or die "ooze sandbox init: no control fd 3: $!\n";
fcntl($ctl, F_SETFD, FD_CLOEXEC);
$SIG{PIPE} = 'IGNORE';
my $L;
if ($sock ne '') {
  socket($L, AF_INET, SOCK_STREAM, 0) or die "ooze sandbox init: socket: $!\n";
  setsockopt($L, SOL_SOCKET, SO_REUSEADDR, pack('l', 1));
  bind($L, pack('S n C4 x8', AF_INET, $port, 127, 0, 0, 1)) or die "ooze sandbox init: bind 127.0.0.1:$port: $!\n";
  listen($L, 128) or die "ooze sandbox init: listen: $!\n";
  nb($L);
}
my $child = fork();
die "ooze sandbox init: fork: $!\n" unless defined $child;
if ($child == 0) {
  close($L) if $L;
  $SIG{PIPE} = 'DEFAULT';
  { no warnings; exec { $ARGV[0] } @ARGV; }
  my $e = "$!";
  syswrite($ctl, "nostart $ARGV[0]: $e\n");
  exit 127;
}
sub nb { my $fh = shift; my $f = fcntl($fh, F_GETFL, 0); fcntl($fh, F_SETFL, $f | O_NONBLOCK); }
my (%peer, %buf, %eof, %fh);
sub drop { my $fd = shift; my @both = ($fd, $peer{$fd} // -1); for my $x (@both) { next unless $fh{$x}; close($fh{$x}); delete $fh{$x}; delete $buf{$x}; delete $eof{$x}; delete $peer{$x}; } }
$SIG{CHLD} = sub { };
my $status;
while (1) {
  my $w = waitpid($child, WNOHANG);
  if ($w == $child) { $status = $?; last; }
  my ($rin, $win) = ('', '');
  vec($rin, fileno($ctl), 1) = 1;
  vec($rin, fileno($L), 1) = 1 if $L;
  for my $fd (map { $_ + 0 } keys %fh) {
    my $p = $peer{$fd};
    vec($rin, $fd, 1) = 1 if !$eof{$fd} && length($buf{$p} // '') < 1048576;
    vec($win, $fd, 1) = 1 if length($buf{$fd} // '') > 0;
  }
  my ($r, $wr) = ($rin, $win);
  my $n = select($r, $wr, undef, 0.5);
  next unless $n && $n > 0;
  if (vec($r, fileno($ctl), 1)) {
    my $got = sysread($ctl, my $cmd, 256);
    if (!$got) { kill 'KILL', -1; exit 137; }
    kill 'TERM', -1 if $cmd =~ /TERM/;
  }
  if ($L && vec($r, fileno($L), 1)) {
    while (accept(my $c, $L)) {
      my $u;
      if (socket($u, AF_UNIX, SOCK_STREAM, 0) && connect($u, pack('S a108', AF_UNIX, $sock))) {
        nb($c); nb($u);
        my ($a, $b) = (fileno($c), fileno($u));
        @fh{$a, $b} = ($c, $u); @peer{$a, $b} = ($b, $a); @buf{$a, $b} = ('', '');
      } else { close($c); }
    }
  }
  for my $fd (map { $_ + 0 } keys %fh) {
    next unless $fh{$fd};
    if (vec($wr, $fd, 1)) {
      my $k = syswrite($fh{$fd}, $buf{$fd});
      if (defined $k) { substr($buf{$fd}, 0, $k) = ''; } elsif ($! + 0 != EAGAIN) { drop($fd); next; }
    }
    if (vec($r, $fd, 1)) {
      my $k = sysread($fh{$fd}, my $data, 65536);
      if ($k) { $buf{$peer{$fd}} .= $data; } elsif (defined $k || $! + 0 != EAGAIN) { $eof{$fd} = 1; }
    }
    my $p = $peer{$fd};
    drop($fd) if defined $p && $eof{$fd} && length($buf{$p} // '') == 0;
  }
}
kill 'KILL', -1;
syswrite($ctl, ($status & 127) ? "signal " . ($status & 127) . "\n" : "exit " . ($status >> 8) . "\n");
exit 0;
`;
