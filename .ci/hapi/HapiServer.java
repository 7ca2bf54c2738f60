// A real HAPI FHIR JPA server for the sandbox differential test (tests/hapi_server.py): HAPI FHIR 8.0.0
// (Apache-2.0) R4 with an in-memory H2 database, configured by HAPI's own test configuration
// (ca.uhn.fhir.jpa.test.config.TestR4Config), served by Jetty on 127.0.0.1:PORT/fhir/. Prints READY when up.
import ca.uhn.fhir.context.FhirContext;
import ca.uhn.fhir.jpa.search.DatabaseBackedPagingProvider;
import ca.uhn.fhir.jpa.test.config.TestR4Config;
import ca.uhn.fhir.rest.server.RestfulServer;
import ca.uhn.fhir.rest.server.provider.ResourceProviderFactory;
import org.eclipse.jetty.ee10.servlet.ServletContextHandler;
import org.eclipse.jetty.ee10.servlet.ServletHolder;
import org.eclipse.jetty.server.Server;
import org.springframework.context.annotation.AnnotationConfigApplicationContext;

/** A HAPI FHIR JPA server (R4, in-memory H2) from HAPI's own test configuration, on 127.0.0.1:PORT/fhir/. */
public class HapiServer {
  public static void main(String[] args) throws Exception {
    int port = Integer.parseInt(args[0]);
    AnnotationConfigApplicationContext ctx = new AnnotationConfigApplicationContext(TestR4Config.class);
    FhirContext fc = ctx.getBean(FhirContext.class);
    RestfulServer rs = new RestfulServer(fc);
    rs.registerProviders(ctx.getBean(ResourceProviderFactory.class).createProviders());
    rs.setPagingProvider(ctx.getBean(DatabaseBackedPagingProvider.class));
    Server server = new Server(new java.net.InetSocketAddress("127.0.0.1", port));
    ServletContextHandler h = new ServletContextHandler();
    h.setContextPath("/");
    h.addServlet(new ServletHolder(rs), "/fhir/*");
    server.setHandler(h);
    server.start();
    System.out.println("READY " + port);
    server.join();
  }
}
